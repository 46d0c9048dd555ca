#include "kernel_stats.hpp"

#include "core/held_count.hpp"

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>

namespace bitship::agent {

constexpr auto kRelaxed = std::memory_order_relaxed;

void RunTimes::add(std::uint64_t ns, std::uint64_t n) noexcept {
    buckets_[bucket_of(ns)].fetch_add(n, kRelaxed);
    sum_.fetch_add(ns * n, kRelaxed);
}

unsigned RunTimes::bucket_of(std::uint64_t ns) noexcept {
    if (ns < kSub) return static_cast<unsigned>(ns);
    auto e = static_cast<unsigned>(63 - std::countl_zero(ns)); // >= 2
    auto sub = static_cast<unsigned>((ns >> (e - 2)) & (kSub - 1));
    return e * kSub + sub;
}

std::uint64_t RunTimes::value_of(unsigned bucket) noexcept {
    if (bucket < kSub) return bucket;
    unsigned e = bucket / kSub, sub = bucket % kSub;
    std::uint64_t width = std::uint64_t{1} << (e - 2);
    return (kSub + sub) * width + width / 2;
}

std::uint64_t RunTimes::count() const noexcept {
    std::uint64_t n = 0;
    for (const auto& b : buckets_) n += b.load(kRelaxed);
    return n;
}

std::uint64_t RunTimes::quantile(double q) const noexcept {
    auto total = count();
    if (total == 0) return 0;
    auto target = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(total))));
    std::uint64_t seen = 0;
    for (unsigned b = 0; b < kBuckets; ++b) {
        seen += buckets_[b].load(kRelaxed);
        if (seen >= target) return value_of(b);
    }
    return value_of(kBuckets - 1);
}

void ErrorCounts::add(Errc code) noexcept {
    auto i = static_cast<std::size_t>(code);
    by_code[i < kCodes ? i : static_cast<std::size_t>(Errc::internal)].fetch_add(1, kRelaxed);
}

std::vector<wire::ErrorCount> ErrorCounts::nonzero() const {
    std::vector<wire::ErrorCount> out;
    for (std::size_t i = 0; i < kCodes; ++i)
        if (auto n = by_code[i].load(kRelaxed)) out.push_back({static_cast<std::uint32_t>(i), n});
    return out;
}

struct KernelStats::KernelSlot {
    CodeHash hash{};
    std::string entry;
    std::atomic<std::uint64_t> calls{0}, bytes_in{0}, bytes_out{0};
    std::atomic<std::uint64_t> compile_ns_first{0}, compile_ns_optimised{0};
    std::atomic<const void*> last_code{nullptr};
    std::atomic<std::uint64_t> last_run_ns{0};
    ErrorCounts errors;
    RunTimes run_times;
};

struct KernelStats::ClientSlot {
    std::string name;
    std::atomic<std::uint64_t> calls{0}, bytes_in{0}, bytes_out{0};
    ErrorCounts errors;
};

namespace {
constexpr std::size_t kKernelTable = 2 * KernelStats::kMaxKernels; // powers of two, half full at most
constexpr std::size_t kClientTable = 2 * KernelStats::kMaxClients;
constexpr std::size_t kConnTable = 4096;

std::size_t key_of(const CodeHash& hash, std::string_view entry) noexcept {
    std::size_t h;
    std::memcpy(&h, hash.data(), sizeof h);
    return h ^ std::hash<std::string_view>{}(entry);
}
} // namespace

KernelStats::KernelStats()
    : kernels_(new std::atomic<KernelSlot*>[kKernelTable]()), other_kernel_(std::make_unique<KernelSlot>()),
      clients_(new std::atomic<ClientSlot*>[kClientTable]()), other_client_(std::make_unique<ClientSlot>()),
      conns_(new ConnEntry[kConnTable]) {
    other_kernel_->entry = "(other)";
    other_client_->name = "(other)";
}

KernelStats::~KernelStats() {
    for (std::size_t i = 0; i < kKernelTable; ++i) delete kernels_[i].load();
    for (std::size_t i = 0; i < kClientTable; ++i) delete clients_[i].load();
}

KernelStats::KernelSlot* KernelStats::kernel(const CodeHash& hash, std::string_view entry) noexcept {
    constexpr std::size_t mask = kKernelTable - 1;
    auto start = key_of(hash, entry) & mask;
    for (std::size_t i = start;; i = (i + 1) & mask) {
        auto* s = kernels_[i].load(std::memory_order_acquire);
        if (!s) break;
        if (s->hash == hash && s->entry == entry) return s;
    }
    // First call of this kernel: insert under the lock (probing again: another thread may
    // have inserted it meanwhile).
    std::lock_guard lock(insert_mutex_);
    std::size_t i = start;
    for (;; i = (i + 1) & mask) {
        auto* s = kernels_[i].load(std::memory_order_acquire);
        if (!s) break;
        if (s->hash == hash && s->entry == entry) return s;
    }
    if (kernel_count_.load(kRelaxed) >= kMaxKernels) return other_kernel_.get();
    try {
        auto slot = std::make_unique<KernelSlot>();
        slot->hash = hash;
        slot->entry = std::string(entry);
        kernels_[i].store(slot.get(), std::memory_order_release);
        kernel_count_.fetch_add(1, kRelaxed);
        return slot.release();
    } catch (const std::bad_alloc&) {
        return other_kernel_.get();
    }
}

void KernelStats::on_client(std::uint64_t conn, std::string_view client) {
    ClientSlot* slot = nullptr;
    {
        std::lock_guard lock(insert_mutex_);
        constexpr std::size_t mask = kClientTable - 1;
        std::size_t i = std::hash<std::string_view>{}(client) & mask;
        for (;; i = (i + 1) & mask) {
            auto* s = clients_[i].load(std::memory_order_acquire);
            if (!s || s->name == client) {
                slot = s;
                break;
            }
        }
        if (!slot) {
            if (client_count_.load(kRelaxed) >= kMaxClients) {
                slot = other_client_.get();
            } else {
                auto made = std::make_unique<ClientSlot>();
                made->name = std::string(client);
                slot = made.release();
                clients_[i].store(slot, std::memory_order_release);
                client_count_.fetch_add(1, kRelaxed);
            }
        }
    }
    // Readers check the conn id first, then take the slot: clear, claim, then publish.
    auto& e = conns_[conn % kConnTable];
    e.client.store(nullptr);
    e.conn.store(conn);
    e.client.store(slot);
}

KernelStats::ClientSlot* KernelStats::client_of(std::uint64_t conn) const noexcept {
    const auto& e = conns_[conn % kConnTable];
    if (e.conn.load() != conn) return other_client_.get();
    auto* c = e.client.load();
    return c && e.conn.load() == conn ? c : other_client_.get();
}

KernelStats::KernelSlot* KernelStats::slot(const CodeHash& hash, std::string_view entry) noexcept { return kernel(hash, entry); }

void KernelStats::on_run(KernelSlot* k, std::uint64_t run_ns, const void* code, std::uint64_t compile_ns,
                         std::uint64_t runs) noexcept {
    k->run_times.add(run_ns, runs);
    k->last_run_ns.store(run_ns, kRelaxed);
    // A new code object for this kernel: its compile time counts once. The first is the fast
    // tier; a later one is the optimised recompile swapped in.
    if (code && k->last_code.load(kRelaxed) != code && k->last_code.exchange(code) != code) {
        auto& tier = k->compile_ns_first.load(kRelaxed) == 0 ? k->compile_ns_first : k->compile_ns_optimised;
        tier.store(compile_ns, kRelaxed);
    }
}

void KernelStats::on_calls(KernelSlot* k, std::uint64_t conn, std::uint64_t calls, std::size_t bytes_in,
                           std::size_t bytes_out) noexcept {
    auto* c = client_of(conn);
    add_held(k->calls, calls);
    add_held(c->calls, calls);
    add_held(k->bytes_in, bytes_in);
    add_held(c->bytes_in, bytes_in);
    add_held(k->bytes_out, bytes_out);
    add_held(c->bytes_out, bytes_out);
}

void KernelStats::on_error(KernelSlot* k, std::uint64_t conn, Errc code) noexcept {
    k->errors.add(code);
    client_of(conn)->errors.add(code);
}

std::uint64_t KernelStats::last_run_ns(const KernelSlot* k) noexcept { return k->last_run_ns.load(kRelaxed); }

void KernelStats::on_answer(const CodeHash& hash, std::string_view entry, std::uint64_t conn, std::size_t bytes_in,
                            const wire::Encoded& answer) noexcept {
    on_answer(kernel(hash, entry), conn, bytes_in, answer);
}

void KernelStats::on_answer(KernelSlot* k, std::uint64_t conn, std::size_t bytes_in, const wire::Encoded& answer) noexcept {
    auto* c = client_of(conn);
    add_held(k->calls, 1);
    add_held(c->calls, 1);
    add_held(k->bytes_in, bytes_in);
    add_held(c->bytes_in, bytes_in);
    if (answer.header.type == wire::Type::error) {
        std::uint32_t code = static_cast<std::uint32_t>(Errc::internal);
        if (answer.payload.size() >= sizeof code) std::memcpy(&code, answer.payload.data(), sizeof code);
        k->errors.add(static_cast<Errc>(code));
        c->errors.add(static_cast<Errc>(code));
        return;
    }
    // A result in the bulk window says its size in the message (wire::WindowSpan).
    std::uint64_t out = answer.payload.size();
    if ((answer.header.flags & wire::kFlagWindow) && answer.payload.size() == 2 * sizeof out)
        std::memcpy(&out, answer.payload.data() + sizeof out, sizeof out);
    add_held(k->bytes_out, out);
    add_held(c->bytes_out, out);
}

wire::KernelStatsReply KernelStats::snapshot() const {
    wire::KernelStatsReply out;
    auto add_kernel = [&](const KernelSlot& k) {
        wire::KernelStat s;
        s.hash = k.hash;
        s.entry = k.entry;
        s.calls = k.calls.load(kRelaxed);
        s.bytes_in = k.bytes_in.load(kRelaxed);
        s.bytes_out = k.bytes_out.load(kRelaxed);
        s.runs = k.run_times.count();
        s.run_p50_ns = k.run_times.quantile(0.50);
        s.run_p99_ns = k.run_times.quantile(0.99);
        s.run_total_ns = k.run_times.sum();
        s.compile_ns_first = k.compile_ns_first.load(kRelaxed);
        s.compile_ns_optimised = k.compile_ns_optimised.load(kRelaxed);
        s.errors = k.errors.nonzero();
        if (s.calls || s.runs) out.kernels.push_back(std::move(s));
    };
    for (std::size_t i = 0; i < kKernelTable; ++i)
        if (const auto* k = kernels_[i].load(std::memory_order_acquire)) add_kernel(*k);
    add_kernel(*other_kernel_);
    auto add_client = [&](const ClientSlot& c) {
        wire::ClientStat s;
        s.client = c.name;
        s.calls = c.calls.load(kRelaxed);
        s.bytes_in = c.bytes_in.load(kRelaxed);
        s.bytes_out = c.bytes_out.load(kRelaxed);
        s.errors = c.errors.nonzero();
        if (s.calls) out.clients.push_back(std::move(s));
    };
    for (std::size_t i = 0; i < kClientTable; ++i)
        if (const auto* c = clients_[i].load(std::memory_order_acquire)) add_client(*c);
    add_client(*other_client_);
    return out;
}

std::uint64_t KernelStats::total_calls() const noexcept {
    std::uint64_t n = other_kernel_->calls.load(kRelaxed);
    for (std::size_t i = 0; i < kKernelTable; ++i)
        if (const auto* k = kernels_[i].load(std::memory_order_acquire)) n += k->calls.load(kRelaxed);
    return n;
}

} // namespace bitship::agent
