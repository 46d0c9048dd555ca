#pragma once
// Per kernel (code hash + entry) and per client identity: calls, errors by code, run-time
// percentiles, compile times, bytes in and out. What `xctl stats` and the metrics endpoint show.
//
// The per-call cost is a table probe and a few relaxed atomic adds on the kernel's own slot:
// no lock and no allocation, except the first call of a new (hash, entry) or a new client,
// which allocates its slot once. Slots are never freed while the agent lives; past kMaxKernels
// (or kMaxClients) further ones are counted together under an "(other)" slot.
//
//   stats.on_client(conn, "bench-client");                    // HELLO
//   auto* k = stats.slot(hash, "chase");                      // a worker, before the kernel runs
//   stats.on_run(k, run_ns, code, compile_ns);                // after it ran
//   stats.on_answer(hash, "chase", conn, args_bytes, reply);  // the call's final answer
//   auto snapshot = stats.snapshot();                         // xctl, metrics

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <bitship/bundle.hpp>
#include <bitship/errc.hpp>

#include "core/wire.hpp"

namespace bitship::agent {

/// Run-time histogram: log2 buckets of nanoseconds, each split in 4, so a percentile read from
/// it is within about 19% of the true value.
class RunTimes {
public:
    static constexpr unsigned kSub = 4;
    static constexpr unsigned kBuckets = 64 * kSub;
    /// `n` runs of `ns` each (a group's calls are recorded at their mean).
    void add(std::uint64_t ns, std::uint64_t n = 1) noexcept;
    /// The `q`-quantile (0..1) in ns, 0 when nothing was recorded.
    [[nodiscard]] std::uint64_t quantile(double q) const noexcept;
    [[nodiscard]] std::uint64_t count() const noexcept;
    /// Every recorded time added up, in ns.
    [[nodiscard]] std::uint64_t sum() const noexcept { return sum_.load(std::memory_order_relaxed); }

    static unsigned bucket_of(std::uint64_t ns) noexcept;
    /// The middle of a bucket's range, in ns.
    static std::uint64_t value_of(unsigned bucket) noexcept;

private:
    std::array<std::atomic<std::uint64_t>, kBuckets> buckets_{};
    std::atomic<std::uint64_t> sum_{0};
};

/// Error counts indexed by Errc; codes beyond this build's count as Errc::internal.
struct ErrorCounts {
    static constexpr std::size_t kCodes = static_cast<std::size_t>(kLastErrc) + 1;
    std::array<std::atomic<std::uint64_t>, kCodes> by_code{};
    void add(Errc code) noexcept;
    [[nodiscard]] std::vector<wire::ErrorCount> nonzero() const;
};

class KernelStats {
public:
    static constexpr std::size_t kMaxKernels = 4096;
    static constexpr std::size_t kMaxClients = 1024;

    KernelStats();
    ~KernelStats();
    KernelStats(const KernelStats&) = delete;
    KernelStats& operator=(const KernelStats&) = delete;

    /// A connection said who it is (HELLO). Later answers on `conn` count for `client`.
    void on_client(std::uint64_t conn, std::string_view client);
    struct KernelSlot;
    /// One kernel's slot (a table probe; made on the kernel's first call), for on_run and
    /// last_run_ns. It lives as long as this object.
    [[nodiscard]] KernelSlot* slot(const CodeHash& hash, std::string_view entry) noexcept;
    /// A kernel ran for `run_ns`; `compile_ns` is its code's first compile (0: native or unknown),
    /// recorded once per code object.
    void on_run(KernelSlot* k, std::uint64_t run_ns, const void* code, std::uint64_t compile_ns,
                std::uint64_t runs = 1) noexcept;
    /// How long this kernel's latest run took, in ns (0: it has not run yet).
    [[nodiscard]] static std::uint64_t last_run_ns(const KernelSlot* k) noexcept;
    /// The final answer of a call on connection `conn`: a RESULT (bytes out) or an ERROR (its code).
    /// on_answer and on_calls are called with the engine's progress token held (where answers
    /// are sent): their counts have one writer at a time and are added without locked
    /// instructions. on_run and on_error may be called from any thread.
    void on_answer(const CodeHash& hash, std::string_view entry, std::uint64_t conn, std::size_t bytes_in,
                   const wire::Encoded& answer) noexcept;
    /// The same for a kernel whose slot() the caller holds.
    void on_answer(KernelSlot* k, std::uint64_t conn, std::size_t bytes_in, const wire::Encoded& answer) noexcept;

    /// A group's `calls` answered in one message (Client::ship_each) on connection `conn`:
    /// counted as that many calls, with their bytes in and out. Each call that failed is also
    /// given to on_error; their run time goes to on_run at the calls' mean.
    void on_calls(KernelSlot* k, std::uint64_t conn, std::uint64_t calls, std::size_t bytes_in,
                  std::size_t bytes_out) noexcept;
    void on_error(KernelSlot* k, std::uint64_t conn, Errc code) noexcept;

    /// Everything, for KERNEL_STATS_REPLY and the metrics endpoint. The views point into this
    /// object's slots, which live as long as it does.
    [[nodiscard]] wire::KernelStatsReply snapshot() const;
    /// Calls answered, over all kernels.
    [[nodiscard]] std::uint64_t total_calls() const noexcept;

    struct ClientSlot;

private:
    KernelSlot* kernel(const CodeHash& hash, std::string_view entry) noexcept;
    ClientSlot* client_of(std::uint64_t conn) const noexcept;

    // Open addressing, insert-only: a probe reads published slot pointers without a lock;
    // inserts (first call of a key) take insert_mutex_.
    std::unique_ptr<std::atomic<KernelSlot*>[]> kernels_;
    std::unique_ptr<KernelSlot> other_kernel_;
    std::unique_ptr<std::atomic<ClientSlot*>[]> clients_;
    std::unique_ptr<ClientSlot> other_client_;
    // conn id → client slot, direct-mapped by conn % size (a newer connection that lands on
    // the same index takes it over; conn ids are checked on read).
    struct ConnEntry {
        std::atomic<std::uint64_t> conn{0};
        std::atomic<ClientSlot*> client{nullptr};
    };
    std::unique_ptr<ConnEntry[]> conns_;
    std::atomic<std::size_t> kernel_count_{0};
    std::atomic<std::size_t> client_count_{0};
    std::mutex insert_mutex_;
};

} // namespace bitship::agent
