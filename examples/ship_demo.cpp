// bitship-demo: connects to running agents, ships the example kernels, prints their results and
// what each call cost (cold: code sent and JIT-compiled; cached: hash only).

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <bitship/client.hpp>
#include <demo_kernels.hpp>

namespace {

using namespace bitship;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

template <class T> bool show(const char* what, const Result<T>& r, double ms, const std::string& expected) {
    if (!r) {
        fmt::print("  {:<34} FAILED: {}\n", what, r.error().describe());
        return false;
    }
    fmt::print("  {:<34} = {:<22} {:8.3f} ms\n", what, fmt::format("{}", *r), ms);
    return expected.empty() || fmt::format("{}", *r) == expected;
}

} // namespace

int main(int argc, char** argv) {
    CLI::App app{"Ships the example kernels to running xagents and prints results and timings"};
    std::vector<std::string> agents;
    std::string transport = "any";
    app.add_option("--agent", agents, "HOST:PORT of an agent (repeatable)")->required();
    app.add_option("--transport", transport, "tcp, shm or any")->check(CLI::IsMember({"tcp", "shm", "any"}))->capture_default_str();
    CLI11_PARSE(app, argc, argv);

    ClientOptions options;
    options.transport = *parse_transport(transport);
    options.loopback_only = true;
    auto client = Client::create(options);
    if (!client) {
        fmt::print(stderr, "bitship-demo: {}\n", client.error().describe());
        return 1;
    }
    bool ok = true;
    for (const auto& address : agents) {
        auto target = client->connect(address);
        if (!target) {
            fmt::print(stderr, "bitship-demo: {}\n", target.error().describe());
            return 1;
        }
        const auto& info = target->info();
        fmt::print("agent {} ({}, cpu {}, LLVM {}, {} cores, {} workers), transport {}\n", address, info.triple, info.cpu,
                   to_string(info.llvm), info.cores, info.workers, transport);

        auto t = Clock::now();
        auto sum = client->ship(demo_kernels::add, *target, std::uint64_t{40}, std::uint64_t{2}).get_as<std::uint64_t>();
        ok &= show("add(40, 2)            [cold]", sum, ms_since(t), "42");
        t = Clock::now();
        sum = client->ship(demo_kernels::add, *target, std::uint64_t{1} << 40, std::uint64_t{7}).get_as<std::uint64_t>();
        ok &= show("add(2^40, 7)          [cached]", sum, ms_since(t), std::to_string((1ull << 40) + 7));
        t = Clock::now();
        auto steps = client->ship(demo_kernels::collatz, *target, std::uint64_t{837799}).get_as<std::uint64_t>();
        ok &= show("collatz(837799) steps [cached]", steps, ms_since(t), "524");
        t = Clock::now();
        auto norm = client->ship(demo_kernels::norm, *target, 3.0, 4.0, 12.0).get_as<double>();
        ok &= show("norm(3, 4, 12)        [cached]", norm, ms_since(t), "13");

        std::string text = "bitship moves compute to data";
        t = Clock::now();
        auto rev = client->ship_bytes(demo_kernels::reverse, *target, Bytes(reinterpret_cast<const std::byte*>(text.data()),
                                                                            reinterpret_cast<const std::byte*>(text.data()) + text.size()))
                       .get();
        auto rev_text = rev.map([](const Bytes& b) { return std::string(reinterpret_cast<const char*>(b.data()), b.size()); });
        ok &= show("reverse(\"bitship moves...\")", rev_text, ms_since(t), "atad ot etupmoc sevom pihstib");

        // Throughput of cached calls, 1000 in flight at a time.
        constexpr int kCalls = 1000;
        t = Clock::now();
        std::vector<Future> futures;
        futures.reserve(kCalls);
        for (int i = 0; i < kCalls; ++i)
            futures.push_back(client->ship(demo_kernels::add, *target, std::uint64_t(i), std::uint64_t(i)));
        int right = 0;
        for (int i = 0; i < kCalls; ++i) {
            auto r = futures[i].get_as<std::uint64_t>();
            right += r && *r == 2ull * i;
        }
        double ms = ms_since(t);
        fmt::print("  {:<34} = {}/{} right in {:.1f} ms ({:.0f} calls/s)\n", "1000 pipelined add calls", right, kCalls, ms,
                   kCalls / ms * 1000);
        ok &= right == kCalls;

        // The same 1000 calls as one group: one message each way, each call its own result.
        struct AddArgs {
            std::uint64_t a, b;
        };
        std::vector<AddArgs> pairs;
        for (int i = 0; i < kCalls; ++i) pairs.push_back({std::uint64_t(i), std::uint64_t(i)});
        t = Clock::now();
        auto group = client->ship_each(demo_kernels::add, *target, pairs).get();
        right = 0;
        for (int i = 0; group && i < kCalls; ++i) {
            auto r = group->get_as<std::uint64_t>(i);
            right += r && *r == 2ull * i;
        }
        ms = ms_since(t);
        if (!group) fmt::print("  1000 add calls as one group: {}\n", group.error().describe());
        else
            fmt::print("  {:<34} = {}/{} right in {:.2f} ms ({:.0f} calls/s)\n", "the same as one group (ship_each)",
                       right, kCalls, ms, kCalls / ms * 1000);
        ok &= right == kCalls;
    }
    auto s = client->stats();
    fmt::print("client: {} RUN messages, {} carried code ({} bytes), {} NEED_CODE\n", s.runs_sent, s.bundles_sent,
               s.bundle_bytes_sent, s.need_code_received);
    return ok ? 0 : 1;
}
