// memory_chase: the floor under bench/pointer_chase. The same walk (the same list of 16-byte
// nodes in the same random order, ChaseList), in this process's own memory: no agent, no call,
// no network, just the dependent loads. An X-RDMA chase of depth d costs at least a round trip
// plus d of these hops on the agent; a GET chase over mapped memory, d of them plus its loop.
// Run with the page size the agent's region gets (pointer_chase prints it): a random hop in a
// 1 GiB region on 4 KiB pages is a TLB miss as well as a DRAM load.
//
//   memory_chase --log2-nodes 26 --pages 4k        # as a shared-memory region by default
//   memory_chase --log2-nodes 26 --pages hugetlb   # needs free hugetlb pages (vm.nr_hugepages)

#include <sys/mman.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "chase.hpp"
#include "core/engine.hpp"
#include "options.hpp"
#include "stats.hpp"

namespace {

using namespace bitship;
using Clock = std::chrono::steady_clock;

struct Config {
    unsigned log2_nodes = 26;
    std::vector<std::uint64_t> depths{1, 1024};
    std::string pages = "4k";
    int reps = 2000;
    std::uint64_t seed = 42;
    std::string csv = "memory_chase.csv";
};

// The nodes, in memory of the page kind asked for (mmap'd, so the kind is the kernel's to give).
struct Nodes {
    bs_chase_node* at = nullptr;
    std::size_t bytes = 0;
    Nodes(std::size_t n, const std::string& pages) : bytes(n * sizeof(bs_chase_node)) {
        const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (pages == "hugetlb" ? MAP_HUGETLB : 0);
        void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
        if (p == MAP_FAILED)
            throw std::runtime_error(fmt::format("mmap of {} MiB ({} pages): {}{}", bytes >> 20, pages, std::strerror(errno),
                                                 pages == "hugetlb" ? " (free hugetlb pages? sysctl vm.nr_hugepages)" : ""));
        if (pages == "4k") ::madvise(p, bytes, MADV_NOHUGEPAGE);
        if (pages == "thp") ::madvise(p, bytes, MADV_HUGEPAGE);
        at = static_cast<bs_chase_node*>(p);
    }
    ~Nodes() { ::munmap(at, bytes); }
    Nodes(const Nodes&) = delete;
    Nodes& operator=(const Nodes&) = delete;
};

} // namespace

int main(int argc, char** argv) {
    bench::Options options{"The floor under pointer_chase: the same dependent walk in this process's own memory"};
    Config cfg;
    options.add("--log2-nodes", cfg.log2_nodes, "nodes = 2^N (26: a 1 GiB list, as pointer_chase --log2-nodes 26)").range(10, 28);
    options.add("--depth", cfg.depths, "walk depths (hops)");
    options.add("--pages", cfg.pages, "page kind: 4k (as a shared-memory region by default), thp, hugetlb").one_of({"4k", "thp", "hugetlb"});
    options.add("--reps", cfg.reps, "timed walks per depth, each from a fresh random start");
    options.add("--seed", cfg.seed, "list seed (pointer_chase uses seed + agents)");
    options.add("--csv", cfg.csv, "write rows here");
    if (auto status = options.parse(argc, argv)) return *status;
    try {
        const std::uint64_t n = 1ull << cfg.log2_nodes;
        // pointer_chase's one-agent list, laid out as an agent's region holds it.
        auto list = xrdma::ChaseList::make(1, n, cfg.seed + 1);
        Nodes nodes(n, cfg.pages);
        const auto& shard = list.shard(0);
        std::memcpy(nodes.at, shard.data(), nodes.bytes);
        fmt::print("memory_chase: {} | 2^{} nodes ({} MiB), {} | {} walks per depth, each from a fresh random start,\n"
                   "  timed one by one (a clock read each side); no agent, no call: the loads alone\n\n",
                   bench::cpu_description(), cfg.log2_nodes, nodes.bytes >> 20, page_size_of(nodes.at), cfg.reps);
        fmt::print("{:<8} {:>6} {:>11} {:>11} {:>11} {:>11}\n", "pages", "depth", "median us", "p99 us", "min us", "ns/hop");
        std::mt19937_64 rng(cfg.seed ^ 0x9e3779b97f4a7c15ull);
        std::vector<bench::Row> rows;
        std::uint64_t sink = 0;
        for (auto depth : cfg.depths) {
            std::vector<double> us;
            us.reserve(cfg.reps);
            for (int r = 0; r < cfg.reps; ++r) {
                // The list's addresses are an agent's (BS_CHASE_ADDRESS): the offset is the node's here.
                const auto* base = reinterpret_cast<const std::byte*>(nodes.at);
                std::uint64_t at = (rng() % n) * sizeof(bs_chase_node);
                std::uint64_t sum = 0;
                const auto t = Clock::now();
                for (std::uint64_t h = 0; h < depth; ++h) {
                    const auto* node = reinterpret_cast<const bs_chase_node*>(base + at);
                    sum += node->payload;
                    at = BS_CHASE_OFFSET(node->next);
                }
                us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count());
                sink += sum + at;
            }
            auto s = bench::summarise(us);
            fmt::print("{:<8} {:>6} {:>11.3f} {:>11.3f} {:>11.3f} {:>11.1f}\n", cfg.pages, depth, s.median, s.p99, s.min,
                       s.median * 1e3 / static_cast<double>(depth));
            rows.push_back({{{"pages", cfg.pages}, {"depth", std::to_string(depth)}}, s, {{"ns_per_hop", s.median * 1e3 / double(depth)}}});
        }
        bench::write_csv(cfg.csv, rows);
        fmt::print("\nrows written to {} (checksum {})\n", cfg.csv, sink);
    } catch (const std::exception& e) {
        fmt::print(stderr, "memory_chase: {}\n", e.what());
        return 1;
    }
    return 0;
}
