// call_allocations: heap calls per call on the client and on the agent, counted, not guessed.
//
// The program runs itself again with bench/alloc_count.c preloaded (LD_PRELOAD), which the
// agents it starts inherit: each process counts its malloc/calloc/realloc/aligned allocations
// and frees into a shared file, read here before and after a run of calls. Per transport:
//   raw AM round trip   PING, answered by the agent's progress thread (no kernel)
//   cached ship         the `empty` kernel with 8-byte arguments, code already on the agent
//   cached batch        the same call in a Batch of --batch (one BATCH message each way)
// A count is the run's total over its calls (after --warmup untimed ones), so what a timer or
// a background thread allocates now and then shows up as a fraction. Counting makes every heap
// call an atomic add on a shared line: no timings are taken here (bench/ship_latency does those).

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <fmt/format.h>

#include <bench_kernels.hpp>
#include <bitship/client.hpp>

#include "alloc_count.h"
#include "launcher.hpp"
#include "loopback_client.hpp"
#include "options.hpp"
#include "stats.hpp"

namespace {

using namespace bitship;

constexpr const char* kDirVariable = "BITSHIP_ALLOC_COUNT_DIR";

/// The counts process `pid` keeps, mapped read-only (null when it keeps none).
class CountsOf {
public:
    explicit CountsOf(pid_t pid) {
        const auto path = std::filesystem::path(std::getenv(kDirVariable)) / std::to_string(pid);
        int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) throw std::runtime_error(fmt::format("no allocation counts for process {} at {}", pid, path.string()));
        void* p = ::mmap(nullptr, sizeof(bitship_alloc_counts), PROT_READ, MAP_SHARED, fd, 0);
        ::close(fd);
        if (p == MAP_FAILED) throw std::runtime_error(fmt::format("cannot map {}", path.string()));
        counts_ = static_cast<const bitship_alloc_counts*>(p);
    }
    ~CountsOf() { ::munmap(const_cast<bitship_alloc_counts*>(counts_), sizeof(bitship_alloc_counts)); }
    CountsOf(const CountsOf&) = delete;
    CountsOf& operator=(const CountsOf&) = delete;

    struct Snapshot {
        std::uint64_t allocations = 0, frees = 0, bytes = 0;
    };
    [[nodiscard]] Snapshot now() const {
        return {counts_->allocations.load(), counts_->frees.load(), counts_->bytes.load()};
    }

private:
    const bitship_alloc_counts* counts_ = nullptr;
};

struct PerCall {
    double allocations = 0, frees = 0, bytes = 0;
};

PerCall per_call(const CountsOf::Snapshot& before, const CountsOf::Snapshot& after, int calls) {
    const double n = calls;
    return {double(after.allocations - before.allocations) / n, double(after.frees - before.frees) / n,
            double(after.bytes - before.bytes) / n};
}

void must(const Result<Bytes>& r, const char* what) {
    if (!r) throw std::runtime_error(fmt::format("{} failed: {}", what, r.error().describe()));
}

/// Runs this program again with the counting library preloaded, unless it already is.
void preload_counting(char** argv) {
    if (std::getenv(kDirVariable) != nullptr) return;
    auto dir = launch::make_temp_dir("bitship-alloc-count-");
    ::setenv(kDirVariable, dir.c_str(), 1);
    ::setenv("LD_PRELOAD", BITSHIP_ALLOC_COUNT_LIB, 1);
    ::execv("/proc/self/exe", argv);
    throw std::runtime_error(fmt::format("cannot run itself again with {} preloaded", BITSHIP_ALLOC_COUNT_LIB));
}

} // namespace

int main(int argc, char** argv) {
    bench::Options options{"Heap calls per call on the client and the agent (counted by a preloaded library), over TCP and shared memory"};
    int calls = 20000;
    int warmup = 2000;
    std::size_t batch = 64;
    std::string progress = "spin-then-block";
    std::vector<std::string> transports{"tcp", "shm"};
    std::string csv;
    options.add("--calls", calls, "counted calls per row").positive();
    options.add("--warmup", warmup, "calls before counting starts");
    options.add("--batch", batch, "calls per Batch in the batch row").range(1, 512);
    options.add("--transport", transports, "transports to measure").transport();
    options.add("--progress", progress, "progress mode of client and agents: spin, block, spin-then-block")
        .progress_mode();
    options.add("--csv", csv, "write the rows as CSV here");
    if (auto status = options.parse(argc, argv)) return *status;

    try {
        preload_counting(argv);
        const auto dir = std::filesystem::path(std::getenv(kDirVariable));
        fmt::print("call_allocations: {} | progress {} | agent: 1 worker | {} counted calls per row after {} warm-up | "
                   "batch rows: {} calls a batch | counts from {} (preloaded)\n\n",
                   bench::cpu_description(), progress, calls, warmup, batch, BITSHIP_ALLOC_COUNT_LIB);
        fmt::print("{:<5} {:<22} {:>14} {:>14} {:>14} {:>14}\n", "tl", "call", "client allocs", "client bytes", "agent allocs",
                   "agent bytes");
        std::ofstream out;
        if (!csv.empty()) {
            out.open(csv);
            out << "transport,call,calls,client_allocations_per_call,client_frees_per_call,client_bytes_per_call,"
                   "agent_allocations_per_call,agent_frees_per_call,agent_bytes_per_call\n";
        }
        CountsOf self(::getpid());
        launch::AgentProgram program{launch::AgentProcess::binary(), {}, std::chrono::seconds(20)};
        const std::uint64_t arg = 7;
        for (const auto& tl : transports) {
            auto transport = parse_transport(tl);
            if (!transport) throw std::runtime_error(transport.error().message);
            launch::AgentProcess agent(program, tl,
                                       {"--progress", progress, "--log-level", "warn", "--workers", "1"});
            CountsOf remote(agent.pid());
            auto client = bench::loopback_client(*transport, progress);
            const auto target = bench::connect_or_throw(client, agent.address());

            Bytes eight(8);
            auto ping = [&] { must(client.ping(target, eight).get(), "ping"); };
            auto ship = [&] { must(client.ship(bench_kernels::empty, target, arg).get(), "cached ship"); };
            // A kernel that answers 8 bytes: the result the caller is handed is a buffer of its own.
            auto ship_inc = [&] { must(client.ship(bench_kernels::inc, target, arg).get(), "cached ship with a result"); };
            auto ship_batch = [&] {
                auto b = client.batch();
                for (std::size_t i = 0; i < batch; ++i) b.add(bench_kernels::empty, target, arg);
                for (auto& f : b.submit()) must(f.get(), "batched ship");
            };
            struct Kind {
                const char* label;
                std::string title;
                std::function<void()> call;
                int per_round;
            };
            const std::vector<Kind> kinds{{"raw_am_rtt", "raw AM round trip", ping, 1},
                                          {"cached_ship", "cached ship (empty, 8 B)", ship, 1},
                                          {"cached_ship_result", "cached ship, 8 B result", ship_inc, 1},
                                          {"cached_batch", fmt::format("cached ship, batch {}", batch), ship_batch,
                                           static_cast<int>(batch)}};
            for (const auto& k : kinds) {
                const int rounds = std::max(1, calls / k.per_round);
                for (int i = 0; i < std::max(1, warmup / k.per_round); ++i) k.call();
                auto c0 = self.now();
                auto a0 = remote.now();
                for (int i = 0; i < rounds; ++i) k.call();
                auto c1 = self.now();
                auto a1 = remote.now();
                const int counted = rounds * k.per_round;
                auto c = per_call(c0, c1, counted);
                auto a = per_call(a0, a1, counted);
                fmt::print("{:<5} {:<22} {:>14.2f} {:>14.1f} {:>14.2f} {:>14.1f}\n", tl,
                           k.title,
                           c.allocations, c.bytes, a.allocations, a.bytes);
                if (out)
                    out << fmt::format("{},{},{},{:.3f},{:.3f},{:.1f},{:.3f},{:.3f},{:.1f}\n", tl, k.label, counted, c.allocations,
                                       c.frees, c.bytes, a.allocations, a.frees, a.bytes);
            }
        }
        std::error_code ignored;
        std::filesystem::remove_all(dir, ignored);
    } catch (const std::exception& e) {
        fmt::print(stderr, "call_allocations: {}\n", e.what());
        return 1;
    }
    return 0;
}
