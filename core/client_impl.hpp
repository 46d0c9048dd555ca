#pragma once
// The client's private parts, shared by the files that implement it:
//   future.cpp          waiting for a result (the waiting caller leads progress)
//   client.cpp          the public API: create, connect, ship, stats
//   client_session.cpp  connections to agents: HELLO/WELCOME, replies, failures, deadlines
//   client_dispatch.cpp the ship path: slice choice, RUN, NEED_CODE
//   client_rma.cpp      regions, one-sided GET/PUT and GET walks
//   client_auth.cpp     the session handshake (AUTH) and the signatures shipped code carries
//   client_bulk.cpp     a same-host agent's bulk window: large arguments and results by memcpy
//   client_busy.cpp     calls an agent refused as busy, sent again as it answers others
// Everything below "progress token" is touched only by whoever progresses the engine (its
// own thread, or a caller leading while it waits), one at a time.

#include <bitship/client.hpp>

#include <array>
#include <atomic>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>

#include "agent_load.hpp"
#include "bulk_window.hpp"
#include "engine.hpp"
#include "id_table.hpp"
#include "wire.hpp"

namespace bitship {

using Clock = std::chrono::steady_clock;

namespace detail {

/// The engine a waiting caller may lead, while its client lives: the client clears it, then
/// waits for the callers using it to let go, before it stops the engine. Shared by the client
/// and every call. A guard is two atomic adds (a shared_mutex's lock and unlock cost some 70
/// instructions more on every wait, scripts/call_instructions.sh).
struct ProgressHandle {
    std::atomic<Engine*> engine{nullptr};
    std::atomic<std::uint64_t> users{0}; ///< callers between use() and its end
    std::atomic<std::uint64_t> completed_by_waiter{0}, completed_by_background{0};

    /// The engine while the client lives (null after), kept alive until the guard goes.
    class Use {
    public:
        explicit Use(ProgressHandle& h) noexcept : h_(h) {
            h_.users.fetch_add(1, std::memory_order_seq_cst);
            engine_ = h_.engine.load(std::memory_order_seq_cst);
        }
        ~Use() { h_.users.fetch_sub(1, std::memory_order_release); }
        Use(const Use&) = delete;
        Use& operator=(const Use&) = delete;
        [[nodiscard]] Engine* engine() const noexcept { return engine_; }

    private:
        ProgressHandle& h_;
        Engine* engine_;
    };
    /// The client's end: no new use finds the engine, and the ones under way are over.
    void retire() noexcept {
        engine.store(nullptr, std::memory_order_seq_cst);
        // (seq_cst, with the users' add then load: one of the two sees the other.)
        while (users.load(std::memory_order_seq_cst) != 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
};

/// Set while this thread leads progress inside Future::wait_for.
inline thread_local bool t_waiter_leads = false;

/// One call's state, shared by the caller's Future and the client's pending table until the
/// call completes. complete() is called once, by whoever progresses (or by the caller before
/// the call was ever submitted).
struct CallState {
    // Provided, so that make_shared's value-initialisation runs the member initialisers alone
    // and does not zero the whole object first (every member has an initialiser).
    CallState() {}
    std::atomic<bool> done{false};
    mutable std::mutex mutex; ///< guards result
    // Read only once `done`; its message is left empty so that making a call allocates nothing here.
    Result<Bytes> result = tl::make_unexpected(Error{Errc::internal, {}});
    Clock::time_point deadline;
    std::shared_ptr<ProgressHandle> progress;
    Engine* engine = nullptr; ///< to wake waiters; valid while anyone can complete the call

    // Progress-token bookkeeping.
    enum class Kind { run, ping, stats, connect, region, get, put, chain, control };
    std::uint64_t id = 0;
    std::uint64_t peer = 0;
    Kind kind = Kind::run;
    std::span<const std::byte> bundle; // the whole bundle (static storage, or `owned`)
    std::optional<std::size_t> forced_slice;
    Device device = Device::any;
    wire::GpuLaunch launch; ///< how a GPU slice is launched (ShipOptions::grid, block, ...)
    std::optional<wire::Each> each; ///< a group of calls (Client::ship_each): `args` holds every set
    bool on_gpu = false;    ///< the slice chosen is the nvptx64 one: the RUN carries `launch`
    std::string entry;
    Bytes args;
    std::shared_ptr<const Bytes> shared_args; ///< Client::ship_shared: the RUN's arguments, uncopied
    /// A RUN's few bytes of arguments (Client::ship_small, Batch::add_small: prepare_small_run),
    /// kept here (`small_size` of them) instead of in a buffer of their own.
    std::array<std::byte, 64> small_args;
    std::uint8_t small_size = 0;
    bool small = false;
    /// A RUN's arguments: `shared_args` if the caller shared them, `small_args` if they are
    /// small, else `args`.
    [[nodiscard]] std::span<const std::byte> run_args() const noexcept {
        if (small) return {small_args.data(), small_size};
        return shared_args ? std::span<const std::byte>(*shared_args) : std::span<const std::byte>(args);
    }
    CodeHash hash{};
    bool resent = false;
    bool sent_code = false; ///< the last RUN of this call carried its code
    bool native = false;  // a pre-installed kernel: no code, an all-zero hash
    bool forward = false; // may forward through the agents' configured peers
    // Forwarding: the peer table by address, this target's index in it, the hop budget.
    std::vector<std::string> peers;
    std::uint16_t self_index = 0;
    std::uint16_t hop_budget = 0;
    // RMA: the region, where, and (get_chain) the walk.
    RemoteRegion region;
    std::uint64_t offset = 0;
    std::uint64_t length = 0; ///< get: how many bytes
    // RUN: the slot of the peer's bulk window this call holds until answered (-1: none), and
    // which of the peer's windows it is in.
    int window_slot = -1;
    std::uint64_t window_generation = 0;
    std::string name;
    Client::NextGet next;
    Bytes scratch;

    /// Runs once, after the result is in (Future::join); set under `mutex` while not done.
    std::function<void()> then;

    void complete(Result<Bytes> r) {
        std::function<void()> after;
        {
            std::lock_guard lock(mutex);
            if (done.load(std::memory_order_relaxed)) return;
            result = std::move(r);
            done.store(true, std::memory_order_seq_cst);
            after = std::move(then);
        }
        if (after) after();
        if (progress)
            (t_waiter_leads ? progress->completed_by_waiter : progress->completed_by_background)
                .fetch_add(1, std::memory_order_relaxed);
        // A caller that could not lead sleeps until a leader completes something: this.
        if (engine) engine->notify_waiters();
    }
};

} // namespace detail

using detail::CallState;
using Kind = CallState::Kind;

struct SliceChoice {
    CodeHash hash{};
    std::shared_ptr<const Bytes> code; // single-slice bundle sent to agents of this triple
    bool gpu = false;                  // the nvptx64 slice, launched on one of the agent's GPUs
};

/// An unpacked remote key, and where its region is mapped here when it is a same-host
/// agent's shared memory (nullptr otherwise).
struct MappedRkey {
    ucp_rkey_h rkey = nullptr;
    std::byte* local_base = nullptr;
};

struct Peer {
    std::uint64_t id = 0;
    std::string host;
    std::uint16_t port = 0;
    std::string address;
    ucp_ep_h ep = nullptr;
    bool welcomed = false;       ///< WELCOME in and, where the agent asks for keys, AUTH accepted
    std::uint64_t auth_request = 0; ///< the AUTH awaiting the agent's ACK (0: none)
    std::shared_ptr<const AgentInfo> info;
    bool reads_split = false; ///< the agent's WELCOME says it reads split messages (wire::kFlagReadsSplit)
    bool reads_compact = false; ///< ... and compact RUNs (wire::kFlagReadsCompact): direct calls go so
    Clock::time_point connect_deadline;
    std::vector<std::shared_ptr<CallState>> waiting; // calls queued until connected
    std::shared_ptr<CallState> connecting;           // connect()'s own call, if any
    /// The slice this agent's triple takes from each embedded bundle, by the bundle's address.
    /// By (bundle storage, ShipOptions::device): which slice serves calls to this peer.
    struct SliceKeyHash {
        std::size_t operator()(const std::pair<const void*, Device>& k) const noexcept {
            return std::hash<const void*>{}(k.first) ^ static_cast<std::size_t>(k.second);
        }
    };
    std::unordered_map<std::pair<const void*, Device>, Result<SliceChoice>, SliceKeyHash> slice_by_bundle;
    /// Hashes this address holds (Client::Impl::known's entry, made on first use).
    std::set<CodeHash>* known = nullptr;
    PeerWindow window; ///< the agent's bulk window for this session, when same-host
    /// Calls the agent refused as busy, oldest first, still pending: sent again one per
    /// answer from it (client_busy.cpp). Some may have completed since (deadline).
    std::deque<std::shared_ptr<CallState>> refused;
};

/// "host:port" (IPv6 in brackets) split and checked.
Result<std::pair<std::string, std::uint16_t>> split_address(std::string_view host_port);

struct Client::Impl {
    ClientOptions options;
    std::optional<Identity> identity; ///< set by create(), read-only after
    std::optional<Identity> author;   ///< ClientOptions::author, when it names another key
    std::unique_ptr<Engine> engine;
    std::shared_ptr<detail::ProgressHandle> progress = std::make_shared<detail::ProgressHandle>();
    std::atomic<std::uint64_t> next_id{1};
    std::atomic<std::uint64_t> next_peer{1};

    std::atomic<std::uint64_t> runs_sent{0}, split_runs_sent{0}, compact_runs_sent{0}, bundles_sent{0}, bundle_bytes_sent{0}, need_code_received{0}, reconnects{0};
    std::atomic<std::uint64_t> stray_replies{0};
    std::atomic<std::uint64_t> busy_resends{0};
    AgentLoadTable loads; ///< what each target's replies said of its load (any thread)

    // --- progress token -------------------------------------------------------------------
    std::unordered_map<std::uint64_t, Peer> peers;
    std::unordered_map<ucp_ep_h, std::uint64_t> peer_by_ep;
    std::uint64_t routes_generation = 0; ///< bumped whenever peer_by_ep changes
    struct LastPeer {
        ucp_ep_h ep = nullptr;
        Peer* peer = nullptr;
        std::uint64_t routes = 0;
    } last_peer; ///< peer_of's last answer, good while routes_generation is the same
    IdTable<std::shared_ptr<CallState>> pending; // calls in flight, by id
    // Hashes each agent address holds, kept across reconnects: a restarted agent that lost
    // them answers NEED_CODE and gets the code once.
    std::map<std::string, std::set<CodeHash>> known;
    // The same for calls that may forward, which carry every slice of their bundle.
    std::map<std::pair<std::string, const void*>, std::set<CodeHash>> known_whole;
    std::map<std::pair<CodeHash, std::size_t>, Result<SliceChoice>> forced_slices;
    /// The slices chosen so far, by what the choice depends on: the bundle (its storage), the
    /// device asked for, the agent's triple and whether it runs GPU kernels (choose_slice).
    struct SharedSliceKey {
        const void* bundle;
        Device device;
        std::string triple;
        bool gpus;
        auto operator<=>(const SharedSliceKey&) const = default;
    };
    std::map<SharedSliceKey, SliceChoice> slice_by_triple;
    std::map<std::pair<std::uint64_t, std::string>, RemoteRegion> regions;
    std::map<CodeHash, Signature> code_signatures; ///< the author's, made once per hash
    std::map<std::pair<ucp_ep_h, const Bytes*>, MappedRkey> rkeys;
    std::uint64_t window_generations = 0;
    /// Kernels (code hash and entry) that have answered kWindowResultMin bytes or more: a call
    /// to one of them with small arguments is still offered a window slot for its result
    /// (offer_window). Other small calls take none and go in the compact RUN.
    struct ByKernel {
        using is_transparent = void;
        template <class A, class B> bool operator()(const A& a, const B& b) const {
            return std::tie(a.first, a.second) < std::tie(b.first, b.second);
        }
    };
    std::set<std::pair<CodeHash, std::string>, ByKernel> large_results;

    std::string agent_name(const Peer& p) const { return fmt::format("agent {}", p.address); }

    /// Any thread: a new call's state, with its deadline.
    std::shared_ptr<CallState> new_call(std::uint64_t peer, Kind kind);
    /// Any thread: a RUN call for `kernel`, not yet submitted (completed already when invalid).
    std::shared_ptr<CallState> prepare_run(const Kernel& kernel, const Target& target, Bytes args, const ShipOptions& options);
    /// prepare_run, with `args` copied into the call's state when they fit (CallState::small_args).
    std::shared_ptr<CallState> prepare_small_run(const Kernel& kernel, const Target& target, std::span<const std::byte> args,
                                                 const ShipOptions& options);
    /// Any thread: submits `c` on the calling thread when it can take the progress token at
    /// once (no thread hand-off), else hands it to whoever progresses.
    void submit_from_caller(const std::shared_ptr<CallState>& c);

    // client_session.cpp
    void start_connect(Peer& p);
    void fail_peer(Peer& p, const Error& why);
    Peer* peer_of(ucp_ep_h ep);
    void on_welcome(Peer& p, const wire::Welcome& w);
    // The session is up (WELCOME, and AUTH where asked): calls waiting for it go.
    void on_session(Peer& p);
    // An answer from an agent this client did not call directly: the last hop of a forwarded
    // call, answering the reply-to. Matched by request id alone; its message names the agent.
    void on_forwarded_reply(Incoming&& in);
    void on_message(Incoming&& in);
    // A RESULT for call `c`: its bytes in the message, or (`window`) in the session's window.
    void on_result(Peer& p, const std::shared_ptr<CallState>& c, Incoming&& in, const wire::WindowSpan* window);
    // An answer to no call in flight (it timed out, or the agent is confused): counted, logged.
    void on_stray(Peer& p, const wire::Header& h);
    void on_ep_error(ucp_ep_h ep, const Error& e);
    void on_tick();
    void shutdown();

    // client_dispatch.cpp
    void submit(const std::shared_ptr<CallState>& c);
    void dispatch(Peer& p, const std::shared_ptr<CallState>& c);
    const Result<SliceChoice>& choose_slice(const CallState& c, Peer& p);
    // The slice `c` takes for `p` (or why none), worked out: the bundle parsed, the slice copied.
    Result<SliceChoice> compute_slice(const CallState& c, const Peer& p) const;
    void send_run(Peer& p, const std::shared_ptr<CallState>& c, bool with_code);
    void send_run_message(Peer& p, const std::shared_ptr<CallState>& c, std::span<const std::byte> code);

    // client_auth.cpp
    // Loads ClientOptions::identity (or BITSHIP_IDENTITY) and ::author.
    Result<void> load_keys();
    // After WELCOME: answers an agent that asks for keys with AUTH (true), else false.
    bool start_auth(Peer& p, const wire::Welcome& w);
    void on_auth_reply(Peer& p, const wire::Message& reply);
    // The author's signatures over the slices of `code`: one over `hash` for a single slice,
    // one per slice for a whole bundle; none without a key.
    std::vector<wire::CodeSignature> sign_code(std::span<const std::byte> code, const CodeHash& hash, bool whole_bundle);

    // client_bulk.cpp
    // With the session's first bulk call or result: asks a same-host agent for the session's
    // bulk window (once; later calls use it when it is mapped).
    void ask_window(Peer& p);
    void on_window_reply(Peer& p, const wire::Message& reply);
    // The session is over: the window with it (calls holding slots are failed by then).
    void drop_window(Peer& p);
    // Gives call `c` a slot of the peer's window, if it wants one and one is free, for its
    // result and (large ones) its arguments, which it copies there; `run` says so.
    void offer_window(Peer& p, CallState& c, wire::Run& run);
    // Whether `c`, with `args` bytes of arguments, wants a slot: bulk arguments, or a kernel
    // in large_results.
    bool wants_slot(const CallState& c, std::size_t args) const;
    // A RESULT in the window: its bytes, when they lie in the slot `c` offered.
    Result<Bytes> window_result(Peer& p, const CallState& c, const wire::WindowSpan& where);
    // `c` was answered: its slot is free for the next call.
    void give_back_slot(Peer& p, CallState& c);

    // client_busy.cpp
    // Whether `reply` is an agent's refusal of a call as busy (it did not run).
    static bool is_busy(const wire::Message& reply);
    // `c` was refused as busy: kept pending, to go again (true), or false when it may not
    // (ClientOptions::resend_busy off, or not a RUN): the caller completes it with the error.
    bool hold_refused(Peer& p, const std::shared_ptr<CallState>& c);
    // The agent answered something, so it holds one call less: the oldest refused call goes again.
    void resend_refused(Peer& p);

    // client_rma.cpp
    Result<MappedRkey> rkey_for(Peer& p, const RemoteRegion& r);
    Result<MappedRkey> checked_rkey(Peer& p, const RemoteRegion& region, std::uint64_t offset, std::size_t length);
    void drop_rkeys(ucp_ep_h ep);
    // One GET or PUT for call `c`; `after` runs on completion with the call still pending.
    void issue_rma(Peer& p, const std::shared_ptr<CallState>& c, const RemoteRegion& region, std::uint64_t offset,
                   std::size_t length, bool is_get, std::function<void(ucs_status_t)> after);
    void start_rma(Peer& p, const std::shared_ptr<CallState>& c);
    // A get or put of a GPU region: GPU_READ or GPU_WRITE, which the agent stages.
    void start_gpu_transfer(Peer& p, const std::shared_ptr<CallState>& c);
    // The next step of a dependent GET walk; runs on the progress thread after each GET.
    void chain_step(const std::shared_ptr<CallState>& c, std::span<const std::byte> last);
};

} // namespace bitship
