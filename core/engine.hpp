#pragma once
// The UCX progress engine shared by clients and agents: one context, one worker, and one
// thread at a time progressing it: the engine's own thread, or a guest that took over with
// lead_until() (an agent's idle worker). Other threads hand work over with post(); UCX
// callbacks only check, enqueue and return, and what they queued is handled after
// ucp_worker_progress returns, by whoever progresses.
//
//   auto engine = Engine::create(options, hooks);   // context + worker, no thread yet
//   engine->start();                                 // the progress thread
//   engine->post([&] { auto ep = engine->connect("127.0.0.1", 7000); ... });

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <span>
#include <vector>

#include <ucp/api/ucp.h>

#include <bitship/errc.hpp>
#include <bitship/transport.hpp>

#include "core_sharing.hpp"
#include "function_ref.hpp"
#include "inflight_ledger.hpp"
#include "progress_token.hpp"
#include "receive_buffers.hpp"
#include "wire.hpp"

namespace bitship {

/// The one place a UCX status becomes a bitship error.
Error from_ucs(ucs_status_t status, std::string_view what);
/// Why an endpoint failed, as its owner is told (on_ep_error).
Error endpoint_failure(ucs_status_t status);

struct EngineOptions {
    Transport transport = Transport::any;
    ProgressMode mode = ProgressMode::spin_then_block;
    /// How long the progress thread keeps polling after the last event before it sleeps on the
    /// worker's event fd (spin_then_block only).
    std::chrono::microseconds spin = kDefaultSpin;
    /// Payloads larger than this are refused before any buffer is allocated.
    std::uint64_t max_message = 64ull << 20;
    /// Loopback only (UCX_NET_DEVICES=lo) unless the environment already says otherwise.
    bool loopback_only = false;
    /// What one peer, and all of them together, may make this side hold (inflight_ledger.hpp):
    /// past it, messages are refused with Errc::busy before any buffer is allocated. None by
    /// default (a client's).
    InflightBudget inflight;
    /// Shared yields after a wake-up that move a polling thread (CoreSharing): an agent's 1, a
    /// client's kSharedYieldsAfterWakeCaller, so that of the pair one moves.
    unsigned shared_yields_after_wake = CoreSharing::kSharedYieldsAfterWake;
};

/// Memory a split RUN's arguments may land in instead of the message's payload
/// (EngineHooks::land_args): `at` has room for them, `keep` holds it until let go.
struct Landing {
    std::span<std::byte> at;
    std::shared_ptr<void> keep;
};

/// A message whose header decoded; the payload is owned here.
struct Incoming {
    Incoming() = default;
    Incoming(ucp_ep_h to, const wire::Header& h, std::vector<std::byte>&& bytes, Hold&& held) noexcept
        : ep(to), header(h), payload(std::move(bytes)), hold(std::move(held)) {}

    ucp_ep_h ep = nullptr; ///< where to answer; null if the sender asked for no reply
    wire::Header header;
    std::vector<std::byte> payload;
    /// The sender's share of EngineOptions::inflight while this message is held: whoever keeps
    /// the payload past on_message keeps this with it.
    Hold hold;
    /// A split message whose data landed where EngineHooks::land_args said (a RUN's
    /// arguments): `payload` holds its other fields, and the arguments belong at byte
    /// `outside.at` of it (wire::decode_run reads them so). `outside_keep` holds their memory.
    /// Empty for every other message.
    wire::OutsideArgs outside;
    std::shared_ptr<void> outside_keep;
    /// Puts landed arguments back into the payload (for a reader that wants one payload).
    void join_outside();
};

/// What the owner of an engine is told, always on the progress thread, never inside a UCX
/// callback (land_args, a question, is asked inside one).
struct EngineHooks {
    std::function<void(Incoming&&)> on_message;
    /// A message that failed its header checks (or was too large to receive).
    std::function<void(ucp_ep_h ep, std::uint64_t request_id, const Error&)> on_bad_message;
    /// The endpoint failed (peer died, connection refused). The engine closes it afterwards.
    std::function<void(ucp_ep_h ep, const Error&)> on_ep_error;
    /// A client connected to our listener; accept() it or drop it.
    std::function<void(ucp_conn_request_h)> on_conn_request;
    /// Called at least every kTick, for deadlines.
    std::function<void()> on_tick;
    /// Called by the engine's own thread about every kTakeover, whoever progresses: it must be
    /// thread-safe and need no token (an agent's kernel watchdog).
    std::function<void()> on_watch;
    /// Whether on_watch has anything to watch now (a kernel running). When false, the engine's
    /// thread sleeps deeply while a guest leads; wake_watch() ends that sleep.
    std::function<bool()> watch_needed;
    /// Where the data of a split message (a RUN's arguments, core/wire_split.hpp) with this
    /// header may land instead of the payload: `bytes` of it, received there by rendezvous or
    /// copied there from an eager message; nullopt: in the payload, as any message. Called
    /// inside UCX's AM callback, on whichever thread progresses: thread-safe, and never calling
    /// into the engine. An agent lands plain RUNs' arguments in its sandbox arena, where a
    /// kernel reads them without a copy (agents/args_landing.hpp).
    std::function<std::optional<Landing>(const wire::Header& header, std::size_t bytes)> land_args;
};

/// Whether shared memory can get huge pages on this host, as the kernel is set: e.g.
/// "transparent huge pages for shared memory: never; hugetlb pages free: 0". Regions a same-host
/// peer maps are shared memory; on 4 KiB pages, every random hop in a large one is a TLB miss.
std::string shared_huge_pages();
/// True when neither transparent huge pages for shared memory (shmem_enabled advise, always or
/// within_size) nor free hugetlb pages are available.
bool shared_huge_pages_off();
/// The pages backing `base` in process `pid` (0: this one), from the kernel's own accounting
/// (/proc/PID/smaps): "4 KiB pages", "2 MiB transparent huge pages (N MiB of them)" or
/// "2048 KiB pages (hugetlb)".
std::string page_size_of(const void* base, pid_t pid = 0);

class Engine {
public:
    static constexpr auto kTick = std::chrono::milliseconds(20);
    /// Rendezvous buffers kept for reuse (receive_buffers()), in all at most.
    static constexpr std::size_t kKeptReceiveBytes = std::size_t{64} << 20;
    /// How soon the engine's thread takes progress back from a guest that left to run a job.
    static constexpr auto kTakeover = std::chrono::milliseconds(5);
    /// How often a caller that cannot lead looks again whether it may.
    static constexpr auto kHandoffCheck = std::chrono::milliseconds(1);
    /// The engine's thread naps this long while it holds progress for a guest's long kernel.
    static constexpr int kTakeoverNapMs = 1;
    /// The longest the engine's thread sleeps while a guest leads and nothing is watched: also
    /// how late a kernel run on the leading worker may be seen by the watchdog or have progress
    /// taken over.
    static constexpr auto kDeepWait = std::chrono::milliseconds(50);
    /// At stop, how long the engine's thread progresses the endpoints' closing.
    static constexpr auto kCloseTimeout = std::chrono::seconds(2);

    static Result<std::unique_ptr<Engine>> create(const EngineOptions& options, EngineHooks hooks);
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    /// Starts the progress thread.
    void start();
    /// Runs the remaining posted work, closes every endpoint, joins the thread. Idempotent.
    void stop();

    /// Runs `fn` on the progress thread. Thread-safe; wakes a sleeping progress thread.
    void post(std::function<void()> fn);

    /// Takes over progress from the engine's own thread until `done()` is true (checked after
    /// every pass, and after every wake-up), then hands it back. Only one thread progresses at a
    /// time; the engine's thread waits meanwhile. An agent's idle worker does this, so a RUN
    /// arriving while it leads runs on it without a thread hand-off. `done` must be cheap;
    /// wake() makes a sleeping leader check it.
    void lead_until(FunctionRef<bool()> done);

    using Clock = std::chrono::steady_clock;
    enum class Lead { led, other_leader };
    /// A caller waiting for its own result: leads progress until `done()` or `until`, unless
    /// another guest already leads (then returns other_leader at once and the caller should
    /// wait_for_handoff()). The engine's own thread hands over within one pass.
    /// `now`: the caller's own clock reading, so leading starts without another.
    Lead try_lead_until(FunctionRef<bool()> done, Clock::time_point until, Clock::time_point now);
    /// Runs `fn` holding the progress token (as a guest), unless another guest leads: then
    /// returns false and the caller post()s instead. For a caller's own submit.
    bool try_progress_once(FunctionRef<void()> fn);
    /// A poller's turn (Future::ready): one pass of progress when nobody holds the token (who
    /// does progresses already), and none when the calling thread holds it (a hook, a join
    /// callback). Without it, a result nobody waits for waits for the engine's thread, which
    /// looks within kDeepWait while callers come and go. Any thread; never blocks.
    void poll_once();
    /// Sleeps until a leader completes something, leaves, or a short bound passes.
    void wait_for_handoff(FunctionRef<bool()> done, Clock::time_point until);
    /// Wakes callers in wait_for_handoff (a completion they may be waiting for); costs one
    /// atomic load when none sleeps. Any thread.
    void notify_waiters();
    /// Called by a leading guest from inside a hook: runs `fn` (a kernel) with the token
    /// released; if it runs long, the engine's thread progresses meanwhile (within kTakeover, or
    /// kDeepWait when it was waiting deeply). `hand_over`: the kernel is expected to run long
    /// (its last run did): the engine's thread is woken to progress from the start, so the
    /// messages that arrive meanwhile (an emulated GET, a ping, the next RUN to queue) wait
    /// a wake-up instead of the whole kernel. One wake-up, worth it only for a long kernel.
    void run_released(FunctionRef<void()> fn, bool hand_over = false);
    /// The calling thread, which led progress as a guest (its lead_until returned), goes on to
    /// something that takes milliseconds and is not a kernel (a GPU call's first compile): the
    /// engine's thread takes progress over now instead of within kDeepWait, so what arrives
    /// meanwhile (a ping, another client's cached call) is answered, not held up. A lock and a
    /// notify; any thread. Another guest leading by then keeps the token.
    void hand_over() noexcept;
    /// Something to watch began (a kernel started): the engine's thread, if in a deep sleep,
    /// resumes its kTakeover watch. One atomic load when it is not asleep. Any thread.
    void wake_watch() noexcept;
    /// Whether the calling thread holds the token as a leading guest (any thread).
    [[nodiscard]] bool guest_leads() const noexcept { return guest_leading_.load(std::memory_order_relaxed); }
    /// Wakes whichever thread is progressing, if it sleeps. Any thread.
    void wake() noexcept { ucp_worker_signal(worker_.get()); }

    // --- whoever progresses only (the engine's thread, or a guest in lead_until) -----------

    /// Starts connecting to `host:port`; failures arrive later through on_ep_error.
    Result<ucp_ep_h> connect(const std::string& host, std::uint16_t port);
    /// Accepts a connection request from our listener.
    Result<ucp_ep_h> accept(ucp_conn_request_h request);
    /// Refuses a connection request: the peer's endpoint fails with UCS_ERR_REJECTED.
    void reject(ucp_conn_request_h request);
    /// Listens on `host:port` (port 0 picks one) and returns the bound port.
    Result<std::uint16_t> listen(const std::string& host, std::uint16_t port);
    /// Sends a message; the engine keeps it alive until UCX is done with it.
    void send(ucp_ep_h ep, wire::Encoded&& message);
    /// While a Cork lives on the thread that made it, small messages (up to kBatchItemBytes)
    /// to one endpoint are gathered and go as one BATCH when it ends (or when kBatchBytes are
    /// gathered): one UCX send and one receive for many calls. Order per endpoint is kept (a
    /// message that is not gathered sends what was gathered for its endpoint first), other
    /// threads send as ever, and a lone gathered message goes as itself. A receiving engine
    /// hands a BATCH's messages on one by one, under a Cork of its own, so their replies
    /// travel together too. Whoever progresses only; corks nest.
    class Cork {
    public:
        explicit Cork(Engine& engine);
        ~Cork();
        Cork(const Cork&) = delete;
        Cork& operator=(const Cork&) = delete;

    private:
        Engine& engine_;
        bool counts_; ///< false: another thread's cork is live (this thread sends as ever)
    };
    static constexpr std::size_t kBatchItemBytes = 1024;
    static constexpr std::size_t kBatchBytes = 7 * 1024; ///< under UCX's eager limit, with the header
    /// Closes an endpoint without waiting (outstanding sends are cancelled).
    void close(ucp_ep_h ep);
    /// Connects to a worker by its UCX address (a reply-to); failures arrive via on_ep_error.
    Result<ucp_ep_h> connect_to_worker(std::span<const std::byte> address);

    /// Registered memory, zeroed and touched, registered for RDMA.
    struct Mapped {
        void* base = nullptr;
        std::size_t size = 0;
        std::size_t mapped_length = 0; ///< size rounded up to whole huge pages
        ucp_mem_h memh = nullptr;
        std::vector<std::byte> packed_rkey;
        bool ucx_allocated = false; ///< shared memory UCX allocated (freed by ucp_mem_unmap)
        bool fixed = false;         ///< placed where the caller said: its range is the caller's to re-reserve
        std::string pages;          ///< what backs it, as the kernel reports ("4 KiB pages", ...)
    };
    /// private: our own anonymous mapping, 2 MiB aligned, transparent huge pages. shared:
    /// allocated by UCX from a shared-memory domain, so same-host peers can map it and read it
    /// by direct loads (falls back to private-like memory when no such domain is enabled).
    enum class RegionMemory { private_pages, shared };
    /// `at`: where to place it (2 MiB aligned, in a range the caller reserved, e.g. the sandbox
    /// arena); nullptr: anywhere.
    /// `touch`: now (every page faulted in before this returns, so no timed walk pays for it)
    /// or on_use (pages come as they are first written; shared memory only, which is zero).
    enum class Touch { now, on_use };
    Result<Mapped> map_memory(std::size_t size, RegionMemory memory = RegionMemory::private_pages, void* at = nullptr,
                              Touch touch = Touch::now);
    /// Deregisters and frees. Memory placed with `at` is left mapped when it is our own
    /// (the caller replaces it with its reservation, so the range never comes free); UCX's
    /// shared memory is unmapped by UCX.
    void unmap_memory(Mapped& m);

    /// The local address at which remote address `remote` of `rkey` can be read by plain loads
    /// (a same-host peer's shared memory, mapped here), or nullptr when it cannot.
    [[nodiscard]] void* rkey_ptr(ucp_rkey_h rkey, std::uint64_t remote) const noexcept;
    /// Unpacks a remote key for `ep`; the caller destroys it with ucp_rkey_destroy.
    Result<ucp_rkey_h> unpack_rkey(ucp_ep_h ep, std::span<const std::byte> packed);
    /// One-sided GET/PUT of `length` bytes at `remote`; `done` runs on the progress thread.
    using RmaDone = std::function<void(ucs_status_t)>;
    void get(ucp_ep_h ep, ucp_rkey_h rkey, std::uint64_t remote, void* local, std::size_t length, RmaDone done);
    void put(ucp_ep_h ep, ucp_rkey_h rkey, std::uint64_t remote, const void* local, std::size_t length, RmaDone done);

    /// This worker's UCX address: what a RUN carries as its reply-to. Any thread.
    [[nodiscard]] std::span<const std::byte> worker_address() const noexcept { return worker_address_; }

    [[nodiscard]] const EngineOptions& options() const noexcept { return options_; }
    /// Bytes of payload handed to UCX so far (any thread).
    [[nodiscard]] std::uint64_t bytes_sent() const noexcept { return bytes_sent_.load(std::memory_order_relaxed); }
    /// Sends handed to UCX and not yet done (a rendezvous the peer has not fetched, a send queued
    /// behind others): a drain waits for these before the process exits (any thread).
    [[nodiscard]] std::uint64_t sends_in_flight() const noexcept {
        return sends_in_flight_.load(std::memory_order_relaxed);
    }
    /// BATCH messages sent, and received and opened (any thread).
    [[nodiscard]] std::uint64_t batches_sent() const noexcept { return batches_sent_.load(std::memory_order_relaxed); }
    [[nodiscard]] std::uint64_t batches_received() const noexcept { return batches_received_.load(std::memory_order_relaxed); }
    /// Times a polling thread moved off a core it shared with another poller (CoreSharing; any thread).
    [[nodiscard]] std::uint64_t core_moves() const noexcept { return core_moves_.load(std::memory_order_relaxed); }
    /// Kernels that had the engine's thread progress from their start (run_released's hand_over).
    [[nodiscard]] std::uint64_t progress_handovers() const noexcept { return handovers_.load(std::memory_order_relaxed); }
    /// What all peers together make this side hold now (EngineOptions::inflight): bytes,
    /// messages. Any thread; 0, 0 when no limit is set.
    [[nodiscard]] std::pair<std::uint64_t, std::uint64_t> inflight_held() const { return inflight_.held_by_all(); }
    /// Where a rendezvous payload may go once read, for the next one to be received into
    /// without a zero-fill (ReceiveBuffers). Any thread; it outlives the engine while held.
    [[nodiscard]] const std::shared_ptr<ReceiveBuffers>& receive_buffers() const noexcept { return receive_buffers_; }

private:
    struct ContextDeleter {
        void operator()(ucp_context_h c) const noexcept { ucp_cleanup(c); }
    };
    struct WorkerDeleter {
        void operator()(ucp_worker_h w) const noexcept { ucp_worker_destroy(w); }
    };
    struct ListenerDeleter {
        void operator()(ucp_listener_h l) const noexcept { ucp_listener_destroy(l); }
    };
    using ContextPtr = std::unique_ptr<std::remove_pointer_t<ucp_context_h>, ContextDeleter>;
    using WorkerPtr = std::unique_ptr<std::remove_pointer_t<ucp_worker_h>, WorkerDeleter>;
    using ListenerPtr = std::unique_ptr<std::remove_pointer_t<ucp_listener_h>, ListenerDeleter>;

    Engine(const EngineOptions& options, EngineHooks hooks);
    void run();
    bool drain();
    bool iterate();
    /// Sleeps on the event fd. With `release_token` (the engine's own thread) the token is let
    /// go while asleep; returns whether it was taken back.
    bool sleep_until_event(std::unique_lock<ProgressToken>& token, bool release_token, int timeout_ms);
    [[nodiscard]] int sleep_timeout_ms(bool engine_thread) const;
    /// Yields the core to any other runnable thread there; a thread that keeps finding one
    /// moves to another core (CoreSharing). `now`: the clock just before. Token held.
    void yield_core(Clock::time_point now);
    /// Whether a poller idle for `idle` (by the last clock read) sleeps now: always in block
    /// mode, in spin-then-block once its spin window is over.
    [[nodiscard]] bool should_sleep(Clock::duration idle) const;
    void lead_locked(std::unique_lock<ProgressToken>& token, FunctionRef<bool()> done, Clock::time_point until,
                     Clock::time_point now);
    bool acquire_as_guest(std::unique_lock<ProgressToken>& token);
    void leader_left();
    void watch(Clock::time_point now);
    ucp_ep_h make_ep(ucp_ep_params_t& params, Result<ucp_ep_h>& out);

    static ucs_status_t on_am(void* arg, const void* header, size_t header_length, void* data, size_t length,
                              const ucp_am_recv_param_t* param) noexcept;
    static void on_recv_data(void* request, ucs_status_t status, size_t length, void* user_data) noexcept;
    static void on_send_done(void* request, ucs_status_t status, void* user_data) noexcept;
    static void on_ep_failed(void* arg, ucp_ep_h ep, ucs_status_t status) noexcept;
    static void on_connection(ucp_conn_request_h request, void* arg) noexcept;
    static void on_rma_done(void* request, ucs_status_t status, void* user_data) noexcept;
    void rma(bool is_get, ucp_ep_h ep, ucp_rkey_h rkey, std::uint64_t remote, void* local, std::size_t length, RmaDone done);

    EngineOptions options_;
    EngineHooks hooks_;
    ContextPtr context_;
    WorkerPtr worker_;
    ListenerPtr listener_;
    int event_fd_ = -1;
    std::vector<std::byte> worker_address_;
    struct RmaCompletion {
        RmaDone done;
        ucs_status_t status;
    };
    std::vector<RmaCompletion> rma_done_;

    std::thread thread_;
    std::atomic<bool> stopping_{false};
    // The progress token: whoever holds it may touch the worker and the queues below. The
    // engine's thread holds it unless a guest (lead_until) asked for it.
    ProgressToken token_;
    std::atomic<int> guests_{0};
    std::mutex guest_mutex_;
    std::condition_variable guest_cv_;
    std::chrono::steady_clock::time_point last_event_{}, last_tick_{}, last_watch_{};
    /// The clock as iterate() last read it (at most kClockEvery passes old).
    std::chrono::steady_clock::time_point now_{};
    /// iterate() reads the clock once in this many passes, idle or busy: a clock read costs
    /// as much as a pass (tens of ns in a VM), and spin windows and deadlines are far coarser.
    static constexpr unsigned kClockEvery = 16;
    /// Idle polling this long starts yielding the core at each clock read (iterate()).
    static constexpr auto kYieldAfter = std::chrono::microseconds(2);
    unsigned idle_passes_ = 0, busy_passes_ = 0;
    /// Whoever holds the token and polls notices when it shares a core with the thread it
    /// waits for, and moves (core_sharing.hpp).
    CoreSharing core_sharing_;
    /// A pass did something since the clock was last read: the next read stamps last_event_.
    bool event_unclocked_ = false;
    std::atomic<bool> guest_leading_{false}; ///< a guest holds the token and progresses
    std::atomic<bool> guest_busy_{false};    ///< a guest let the token go to run a kernel
    std::atomic<bool> deep_wait_{false};     ///< the engine's thread sleeps with nothing to watch
    std::atomic<bool> guest_asleep_{false};  ///< the leading guest sleeps on the event fd
    std::atomic<bool> watch_wanted_{false};
    std::mutex handoff_mutex_;
    std::condition_variable handoff_cv_;
    std::uint64_t handoff_generation_ = 0;
    std::atomic<int> handoff_sleepers_{0};
    std::atomic<int> sleepers_{0}; ///< threads asleep on the event fd
    std::atomic<std::uint64_t> bytes_sent_{0};
    std::size_t max_am_header_ = 0; ///< UCX's largest AM header: a split message's parts must fit
    std::atomic<std::uint64_t> sends_in_flight_{0};
    /// Held messages and undelivered answers, per peer and in all (options_.inflight); whoever progresses.
    InflightLedger inflight_;
    // None kept under a sanitizer (malloc_is_tunable), whose use-after-free checks need a
    // payload that is let go to be freed: set by create().
    std::shared_ptr<ReceiveBuffers> receive_buffers_;
    std::atomic<std::uint64_t> core_moves_{0};
    std::atomic<std::uint64_t> handovers_{0};
    std::atomic<bool> handover_wanted_{false}; ///< a long kernel began: the engine's thread takes over at once

    // engine_batch.cpp: gathering under a Cork, and opening a BATCH that arrived.
    // Messages are copied into the BATCH as they come, so each one's buffer is freed at once
    // and the next message reuses it (glibc keeps only a few freed blocks of a size at hand:
    // 32 replies held until the cork ends cost measurably more on both sides). The first waits
    // on its own: alone, it goes as it is.
    struct Gathered {
        ucp_ep_h ep;
        wire::Encoded first;
        wire::Encoded batch;
        std::size_t count = 0;
        std::size_t bytes = 0;
    };
    std::vector<Gathered>::iterator find_gathered(ucp_ep_h ep);
    bool gather(ucp_ep_h ep, wire::Encoded& message);
    void send_gathered(ucp_ep_h ep);
    void send_all_gathered();
    void drop_gathered(ucp_ep_h ep);
    void open_batch(Incoming&& batch);
    void send_now(ucp_ep_h ep, wire::Encoded&& message);
    int cork_depth_ = 0;
    std::thread::id cork_owner_;
    std::vector<Gathered> gathered_;
    std::atomic<std::uint64_t> batches_sent_{0};
    std::atomic<std::uint64_t> batches_received_{0};

    std::mutex posted_mutex_;
    std::vector<std::function<void()>> posted_;
    std::atomic<bool> has_posted_{false};

    // Filled by UCX callbacks on the progress thread, drained by it after progress returns.
    struct BadMessage {
        ucp_ep_h ep;
        std::uint64_t request_id;
        Error error;
    };
    struct EpFailure {
        ucp_ep_h ep;
        ucs_status_t status;
    };
    std::vector<Incoming> arrived_;
    std::vector<Incoming> arrived_spare_; // drain()'s last batch, emptied: its storage is reused
    std::vector<BadMessage> bad_;
    std::vector<EpFailure> failed_;
    std::vector<ucp_conn_request_h> conn_requests_;
    std::vector<ucp_ep_h> endpoints_; ///< open endpoints, closed at stop()
};

} // namespace bitship
