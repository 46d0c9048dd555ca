// cache_cap: does `xagent --cache-mib` bound an agent's memory while it is shipped thousands of
// distinct kernels in a loop, every call still answered correctly? One run, two agents side by
// side: one capped, one unbounded. Distinct kernels are made from one: the `inc` kernel's
// bitcode inside LLVM's bitcode wrapper header, whose CPU-type field differs per kernel, so
// each has a hash (and a compile, and a place in the cache) of its own.

#include <array>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <bench_kernels.hpp>
#include <bitship/bundle.hpp>
#include <bitship/client.hpp>

#include "launcher.hpp"
#include "options.hpp"
#include "stats.hpp"

namespace {

using namespace bitship;

std::vector<std::byte> wrapped_bundle(std::uint32_t variant) {
    auto view = BundleView::parse(bench_kernels::inc.bundle());
    if (!view) throw std::runtime_error(view.error().describe());
    const auto& slice = view->slices.at(0); // x86_64
    const std::array<std::uint32_t, 5> header{0x0B17C0DE, 0, 20, static_cast<std::uint32_t>(slice.bitcode.size()), variant};
    std::vector<std::byte> bitcode(sizeof header);
    std::memcpy(bitcode.data(), header.data(), sizeof header);
    bitcode.insert(bitcode.end(), slice.bitcode.begin(), slice.bitcode.end());
    SliceInput input{slice.triple, slice.cpu, slice.producer, slice.llvm, bitcode};
    return write_bundle(view->entries, std::span(&input, 1));
}

double rss_mib(pid_t pid) {
    std::ifstream in(fmt::format("/proc/{}/status", pid));
    std::string key;
    while (in >> key) {
        if (key == "VmRSS:") {
            double kb = 0;
            in >> kb;
            return kb / 1024.0;
        }
        in.ignore(1 << 10, '\n');
    }
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    bench::Options options{"Resident memory of an agent shipped many distinct kernels, with and without --cache-mib"};
    unsigned kernels = 10000, every = 1000, cap_mib = 8;
    std::string csv;
    options.add("--kernels", kernels, "distinct kernels shipped, one call each");
    options.add("--every", every, "sample resident memory every this many kernels");
    options.add("--cache-mib", cap_mib, "the capped agent's --cache-mib");
    options.add("--csv", csv, "write the samples here");
    if (auto status = options.parse(argc, argv)) return *status;

    fmt::print("cache_cap: {} | {} distinct kernels, one cached-nowhere call each, TCP loopback | agent A: --cache-mib {} | "
               "agent B: unbounded | 1 worker each, tiered JIT (defaults)\n\n",
               bench::cpu_description(), kernels, cap_mib);
    fmt::print("{:>8} {:>16} {:>16} {:>12}\n", "kernels", "A capped RSS MiB", "B unbounded MiB", "wrong calls");
    std::vector<bench::Row> rows;
    try {
        launch::AgentProcess capped("tcp", {"--cache-mib", std::to_string(cap_mib), "--workers", "1", "--log-level", "warn"});
        launch::AgentProcess unbounded("tcp", {"--workers", "1", "--log-level", "warn"});
        ClientOptions o;
        o.transport = Transport::tcp;
        o.loopback_only = true;
        auto client = Client::create(o);
        if (!client) throw std::runtime_error(client.error().describe());
        auto a = client->connect(capped.address());
        auto b = client->connect(unbounded.address());
        if (!a || !b) throw std::runtime_error("cannot connect to the agents");
        std::uint64_t wrong = 0;
        for (unsigned i = 0; i < kernels; ++i) {
            auto bundle = wrapped_bundle(i); // a fresh buffer each time; the client names slices by content
            for (const auto* t : {&*a, &*b}) {
                Bytes args(8);
                std::uint64_t x = i;
                std::memcpy(args.data(), &x, 8);
                auto r = client->ship_slice(bundle, 0, "inc", *t, args).get();
                std::uint64_t y = 0;
                if (!r || r->size() != 8 || (std::memcpy(&y, r->data(), 8), y != x + 1)) {
                    if (!r) fmt::print(stderr, "kernel {}: {}\n", i, r.error().describe());
                    ++wrong;
                }
            }
            if ((i + 1) % every == 0 || i + 1 == kernels) {
                double ra = rss_mib(capped.pid()), rb = rss_mib(unbounded.pid());
                fmt::print("{:>8} {:>16.1f} {:>16.1f} {:>12}\n", i + 1, ra, rb, wrong);
                rows.push_back({{{"kernels", std::to_string(i + 1)}}, {}, {{"capped_rss_mib", ra}, {"unbounded_rss_mib", rb}, {"wrong", double(wrong)}}});
            }
        }
        auto stats = client->agent_stats(*a);
        if (stats)
            for (const auto& [k, v] : *stats)
                if (k == "compiles" || k == "cache_hits" || k == "need_code_sent") fmt::print("capped agent {}: {}\n", k, v);
        fmt::print("\n{} calls, {} wrong\n", 2ull * kernels, wrong);
    } catch (const std::exception& e) {
        fmt::print(stderr, "cache_cap: {}\n", e.what());
        return 1;
    }
    if (!csv.empty()) bench::write_csv(csv, rows);
    return 0;
}
