// A program outside the bitship tree: find_package(bitship), one kernel, one call.
#include <cstdio>
#include <bitship/client.hpp>
#include <my_kernels.hpp>
int main(int argc, char** argv) {
    auto client = bitship::Client::create().value();
    auto agent = client.connect(argv[1]);
    if (!agent) { std::puts(agent.error().describe().c_str()); return 1; }
    auto r = client.ship(my_kernels::twice, *agent, std::uint64_t{21}).get_as<std::uint64_t>();
    if (!r) { std::puts(r.error().describe().c_str()); return 1; }
    std::printf("twice(21) = %llu\n", (unsigned long long)*r);
    return *r == 42 ? 0 : 1;
}
