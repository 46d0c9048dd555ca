#pragma once
// The wire protocol: a fixed, versioned header carried as the UCX AM header, and a payload
// carried as the AM data (eager or rendezvous). Decoding checks every length and offset before
// use and returns views into the payload buffer, which the caller keeps alive.

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <bitship/bundle.hpp>
#include <bitship/capabilities.hpp>
#include <bitship/errc.hpp>
#include <bitship/identity.hpp>

#include "byte_io.hpp"

namespace bitship::wire {

/// The single UCX active-message id bitship registers; the message type is in our header.
inline constexpr unsigned kAmId = 0xb5;
inline constexpr std::uint32_t kMagic = 0x50485342; // "BSHP"
inline constexpr std::uint8_t kVersion = 1;

enum class Type : std::uint8_t {
    hello = 1,       ///< client → agent: first message on a connection
    welcome = 2,     ///< agent → client: what the agent is (triple, CPU, LLVM, limits)
    run = 3,         ///< run kernel `entry` of code `hash` with `args`; code attached or not
    need_code = 4,   ///< agent → client: resend request `id` with its code attached
    result = 5,      ///< agent → caller: the kernel's reply bytes
    error = 6,       ///< agent → caller: an Errc, the kernel's own code, and a message
    ping = 7,        ///< raw round trip: answered by the agent's progress thread
    pong = 8,
    stats = 9,       ///< ask for the agent's counters
    stats_reply = 10,
    region = 11,      ///< client → agent: describe memory region `name` (base, size, rkey)
    region_info = 12, ///< agent → client
    // Operator control (xctl). Each request is answered by its reply, or by ERROR.
    info = 13,               ///< what the agent is: triple, CPU, cores, NUMA, GPUs, LLVM, uptime, modes
    info_reply = 14,         ///< Fields
    kernel_stats = 15,       ///< per kernel (hash, entry) and per client: calls, errors by code, times, bytes
    kernel_stats_reply = 16, ///< KernelStatsReply
    cache_list = 17,         ///< the code the agent holds
    cache_list_reply = 18,   ///< CacheList
    cache_evict = 19,        ///< drop one hash from the code cache: answered by ACK
    ack = 20,                ///< Ack: whether the request did something, and a note
    drain = 21,              ///< stop accepting RUNs, finish those in flight, exit: answered by ACK at once
    auth = 22,               ///< client → agent: its key and signature over WELCOME's challenge; ACK or ERROR
    window = 23,             ///< client → agent: this session's bulk window (REGION_INFO, or ERROR)
    batch = 24,              ///< either way: several whole messages in one (split_batch)
    gpu_read = 25,           ///< client → agent: bytes of a GPU region (RESULT, or ERROR)
    gpu_write = 26,          ///< client → agent: bytes into a GPU region (ACK, or ERROR)
};

/// The highest message type this build knows.
inline constexpr Type kLastType = Type::gpu_write;

/// Header::flags of a RUN whose payload starts with a WindowUse, and of a RESULT whose payload
/// is a WindowSpan (the bytes are in the session's bulk window, agents/bulk_windows.hpp).
inline constexpr std::uint16_t kFlagWindow = 1u << 0;
/// Header::flags of a RUN for a GPU slice: its payload carries a GpuLaunch (after the WindowUse
/// when it has both).
inline constexpr std::uint16_t kFlagGpu = 1u << 1;
/// Header::flags of a RUN that is a group of calls of one kernel (Client::ship_each): its payload
/// starts with an Each, and its RESULT carries every call's answer (EachResultsWriter). Never
/// with kFlagWindow or kFlagGpu. A RUN with any other flag is refused.
inline constexpr std::uint16_t kFlagEach = 1u << 2;
/// Header::flags of a WELCOME from an agent that reads split messages (core/wire_split.hpp):
/// clients send a large RUN's arguments uncopied only to such an agent, and copy them into the
/// message for an older one, whose WELCOME has no flags. Older clients ignore WELCOME's flags.
inline constexpr std::uint16_t kFlagReadsSplit = 1u << 3;
/// Header::flags of a RUN in its compact form: a direct call (no hops, peers, reply-to or code;
/// origin = the request id) as `hash[32] · u32 args size · str16 entry · padding to
/// kArgsAlignment · args`, 40-odd bytes fewer than the full form's fields, so that a cached
/// call with small arguments fits UCX's short message (100 bytes over shared memory, header
/// included). Never with another flag. Sent only to an agent whose WELCOME has
/// kFlagReadsCompact; older agents refuse the flag.
inline constexpr std::uint16_t kFlagCompact = 1u << 4;
/// Header::flags of a WELCOME from an agent that reads compact RUNs.
inline constexpr std::uint16_t kFlagReadsCompact = 1u << 5;

std::string_view to_string(Type t) noexcept;

/// The AM header of every message: 24 bytes.
struct Header {
    std::uint32_t magic = kMagic;
    std::uint8_t version = kVersion;
    Type type{};
    std::uint16_t flags = 0;
    std::uint64_t request_id = 0;
    std::uint32_t payload_size = 0; ///< must equal the AM data length
    /// RESULT and ERROR: the replying agent's load (core/agent_load.hpp: queued | busy << 16);
    /// 0 elsewhere, and from agents that predate it (read as idle).
    std::uint32_t reserved = 0;
};
static_assert(sizeof(Header) == 24);

/// Checks magic, version and the declared payload size against what arrived.
Result<Header> decode_header(std::span<const std::byte> bytes, std::size_t payload_size);

/// Agent limits, sent in WELCOME so clients never send what would be refused.
struct Limits {
    std::uint64_t max_message = 64ull << 20; ///< largest payload accepted (code + args)
    std::uint32_t max_args = 1u << 20;
    std::uint32_t max_result = 16u << 20;
};

struct Hello {
    std::string_view client;
};

struct Welcome {
    std::string_view agent;   ///< "host:port" as the agent knows itself
    std::string_view triple;
    std::string_view cpu;
    LlvmVersion llvm;
    Limits limits;
    std::uint32_t cores = 0;
    std::uint32_t workers = 0;
    std::uint64_t instance = 0; ///< random per agent start
    /// Carried as one length-prefixed block after the fields above. Its fields are read in
    /// order; bytes after the last field this build knows are ignored, so later fields (GPU
    /// details, ...) are appended at its end without breaking older decoders.
    Capabilities caps;
    /// Appended to the same block after the capabilities: `u8 access · challenge[32]`. A block
    /// without them (an older agent) reads as open access with an all-zero challenge.
    AgentAccess access = AgentAccess::open;
    /// Fresh random bytes per connection: what AUTH signs (core/signing.hpp). Zero when open.
    std::array<std::uint8_t, 32> challenge{};
    /// After the challenge: `u8 sandbox`. Absent (an older agent): none.
    SandboxMode sandbox = SandboxMode::none;
    /// Header::flags kFlagReadsSplit: the agent reads split messages. Unset by older agents.
    bool reads_split = false;
    /// Header::flags kFlagReadsCompact: the agent reads compact RUNs. Unset by older agents.
    bool reads_compact = false;
};

/// AUTH: the client's public key and its signature over (challenge, instance, key).
struct Auth {
    PublicKey key{};
    Signature signature{};
};

/// An author's signature over one slice's hash (core/signing.hpp), travelling with the code.
struct CodeSignature {
    CodeHash hash{};
    PublicKey signer{};
    Signature signature{};
    friend bool operator==(const CodeSignature&, const CodeSignature&) = default;
};
inline constexpr std::size_t kCodeSignatureBytes = 32 + 32 + 64;

/// Arguments start at this alignment within the payload (payload buffers are allocated at
/// least this aligned), so kernels may cast bs_args() to their struct.
inline constexpr std::size_t kArgsAlignment = 16;

/// Where a RUN's arguments lie in the session's bulk window, and where its result may go.
/// A slot of the window, offered by the client: args_size bytes at args_offset (0: the
/// arguments travel in the message), a result of up to result_capacity bytes at result_offset.
struct WindowUse {
    std::uint64_t args_offset = 0;
    std::uint64_t args_size = 0;
    std::uint64_t result_offset = 0;
    std::uint64_t result_capacity = 0;
};

/// How a GPU RUN is launched (ShipOptions::grid, block, gpu_result_bytes, gpu_device). A zero
/// grid or block `x` asks for the agent's default geometry.
struct GpuLaunch {
    std::array<std::uint32_t, 3> grid{0, 1, 1};
    std::array<std::uint32_t, 3> block{0, 1, 1};
    std::uint32_t result_bytes = 8;
    std::uint32_t device = 0;
    friend bool operator==(const GpuLaunch&, const GpuLaunch&) = default;
};

/// A RESULT's bytes in the session's bulk window.
struct WindowSpan {
    std::uint64_t offset = 0;
    std::uint64_t size = 0;
};

/// A group of calls (kFlagEach): `count` argument sets of `size` bytes each, back to back in
/// Run::args, each starting at a multiple of kArgsAlignment (each_stride). The agent runs the
/// kernel once per set, each run its own call (own sandbox call, time budget and answer).
struct Each {
    std::uint32_t count = 0;
    std::uint32_t size = 0;
    friend bool operator==(const Each&, const Each&) = default;
};
/// Most calls in one group.
inline constexpr std::uint32_t kMaxEachCalls = 65536;
/// Where a group's argument set i starts: i × each_stride(size).
constexpr std::size_t each_stride(std::uint32_t size) noexcept {
    return (std::size_t{size} + kArgsAlignment - 1) / kArgsAlignment * kArgsAlignment;
}

struct Run {
    CodeHash hash{};
    std::uint64_t origin = 0;      ///< the caller's request id: what the final answer carries
    std::uint16_t hop_budget = 0;  ///< forwards still allowed
    std::uint16_t hops = 0;        ///< forwards taken so far
    std::uint16_t self_index = 0;  ///< this agent's index in `peers` (when there are peers)
    std::string_view entry;
    std::span<const std::byte> args;
    std::span<const std::byte> code;     ///< a bundle, or empty when the agent should have it
    std::span<const std::byte> reply_to; ///< the caller's UCX worker address; empty: answer the sender
    std::vector<std::string_view> peers; ///< "host:port" of agents a kernel may forward to
    /// Who made the attached code: a signature per slice of `code` (one, or one per slice of a
    /// whole bundle), by its author. Sent with code only, after the peers as `u16 n · n ×
    /// (hash, signer, signature)`; a RUN that ends after the peers has none.
    std::vector<CodeSignature> signatures;
    /// Sent (Header::flags kFlagWindow) by a client that holds a bulk window on this session;
    /// with it the message's own args are empty. Never forwarded.
    std::optional<WindowUse> window;
    /// Sent (Header::flags kFlagGpu) when the code is a GPU slice. Never forwarded.
    std::optional<GpuLaunch> gpu;
    /// Sent (Header::flags kFlagEach) for a group of calls; `args` holds every call's set.
    /// Such a RUN has no peers, no reply-to and no hops: its calls cannot forward.
    std::optional<Each> each;
};

struct NeedCode {
    CodeHash hash{};
};

struct ResultMsg {
    std::span<const std::byte> bytes;
    std::optional<WindowSpan> window; ///< set (kFlagWindow): the bytes are there, not in the message
};

struct ErrorMsg {
    Errc code = Errc::internal;
    std::int32_t kernel_code = 0; ///< bs_fail's code, when code == kernel_failed
    std::string_view message;
};

struct Ping {
    std::span<const std::byte> bytes;
};

struct StatsReply {
    std::vector<std::pair<std::string_view, std::uint64_t>> counters;
};

struct Region {
    std::string_view name;
};

struct RegionInfo {
    std::uint64_t base = 0;
    std::uint64_t size = 0;
    std::span<const std::byte> rkey; ///< packed UCX remote key (empty for a GPU region)
    /// A GPU region: `u8 1 · u32 index` after the rkey (absent: host memory). `gpu_index` is its
    /// place in a GPU kernel's `regions`; base is 0 (its device address is the agent's own).
    bool gpu = false;
    std::uint32_t gpu_index = 0;
};

/// GPU_READ: `length` bytes at `offset` of GPU region `name`.
struct GpuRead {
    std::string_view name;
    std::uint64_t offset = 0;
    std::uint64_t length = 0;
};

/// GPU_WRITE: `bytes` at `offset` of GPU region `name`.
struct GpuWrite {
    std::string_view name;
    std::uint64_t offset = 0;
    std::span<const std::byte> bytes;
};

/// INFO_REPLY: name → value, both text, in the agent's order; a value an agent cannot tell is "n/a".
struct Fields {
    std::vector<std::pair<std::string_view, std::string_view>> fields;
};

/// A count of answers that failed with one Errc (kept raw: a newer agent's codes survive).
struct ErrorCount {
    std::uint32_t code = 0;
    std::uint64_t count = 0;
    friend bool operator==(const ErrorCount&, const ErrorCount&) = default;
};

/// One kernel entry of one code hash, as the agent that answered its calls saw it.
struct KernelStat {
    CodeHash hash{}; ///< all zero: a native kernel
    std::string_view entry;
    std::uint64_t calls = 0;     ///< calls this agent answered (results and errors)
    std::uint64_t bytes_in = 0;  ///< argument bytes of those calls
    std::uint64_t bytes_out = 0; ///< reply bytes of the successful ones
    std::uint64_t runs = 0;      ///< kernel executions timed
    std::uint64_t run_p50_ns = 0;
    std::uint64_t run_p99_ns = 0;
    std::uint64_t run_total_ns = 0; ///< all runs' time added up
    std::uint64_t compile_ns_first = 0;     ///< the first (fast) compile of the code
    std::uint64_t compile_ns_optimised = 0; ///< the background full-optimisation recompile
    std::vector<ErrorCount> errors;
};

/// One client identity (what it said in HELLO) and what it asked of this agent.
struct ClientStat {
    std::string_view client;
    std::uint64_t calls = 0;
    std::uint64_t bytes_in = 0;
    std::uint64_t bytes_out = 0;
    std::vector<ErrorCount> errors;
};

struct KernelStatsReply {
    std::vector<KernelStat> kernels;
    std::vector<ClientStat> clients;
};

/// One hash the code cache holds.
struct CacheEntry {
    CodeHash hash{};
    std::uint64_t memory_bytes = 0; ///< compiled code in memory (0: on disk only)
    std::uint64_t disk_bytes = 0;   ///< in the disk cache (0: not there)
    std::uint64_t idle_ms = 0;      ///< since its last use
    bool in_use = false;            ///< a running call holds it (never evicted then)
};

struct CacheList {
    std::vector<CacheEntry> entries;
};

struct CacheEvict {
    CodeHash hash{};
};

struct Ack {
    bool done = false;
    std::string_view note;
};

struct Empty {};

using Body = std::variant<Hello, Welcome, Run, NeedCode, ResultMsg, ErrorMsg, Ping, StatsReply, Region, RegionInfo, Fields,
                          KernelStatsReply, CacheList, CacheEvict, Ack, Auth, GpuRead, GpuWrite, Empty>;

/// A decoded message: views into the payload buffer it was decoded from.
struct Message {
    Header header;
    Body body;
};

/// Decodes a payload whose header already passed decode_header().
Result<Message> decode(const Header& header, std::span<const std::byte> payload);
/// A split RUN's arguments, received apart from its other fields (Incoming::outside): they
/// belong at byte `at` of its payload, which holds the fields before and after them.
struct OutsideArgs {
    std::span<const std::byte> bytes;
    std::size_t at = 0;
};

/// What decode() does for a RUN, straight into `out` (value-initialized; its views point into
/// `payload`), without the Message around it: the agent's path of every call. With `outside`,
/// `payload` lacks the arguments, and `out.args` is `outside->bytes` if they lie exactly where
/// the fields say (else malformed_message).
Result<void> decode_run(const Header& header, std::span<const std::byte> payload, Run& out,
                        const OutsideArgs* outside = nullptr);

/// An encoded message: header and payload, kept alive until UCX is done sending them.
struct Encoded {
    Header header;
    std::vector<std::byte> payload;
    /// Sent in place of `payload` (then empty), without a copy: memory that `keep` holds until
    /// UCX is done with it, when the engine drops `keep` (on its own thread). Never gathered
    /// into a BATCH.
    std::span<const std::byte> borrowed;
    std::shared_ptr<const void> keep;
    /// With both `payload` and `borrowed` set, a split message (core/wire_split.hpp): its
    /// payload is payload[0, split_at), then `borrowed`, then payload[split_at, end). The engine
    /// sends the two small parts in the AM header and `borrowed` as the data, uncopied; the
    /// receiver puts the three together again, so decoders see the one payload.
    std::size_t split_at = 0;
    [[nodiscard]] bool split() const noexcept { return !borrowed.empty() && !payload.empty(); }
    /// The payload as one run of bytes (not for a split message: join_split() it first).
    [[nodiscard]] std::span<const std::byte> bytes() const noexcept {
        return borrowed.empty() ? std::span<const std::byte>(payload) : borrowed;
    }
};

/// The WELCOME capabilities block (Welcome::caps): written by encode_welcome, read by decode.
/// Decoding refuses a block that ends inside a field or names an unknown node kind; `used`,
/// when given, gets how many bytes of the block the capabilities took (later fields follow).
std::vector<std::byte> encode_capabilities(const Capabilities& caps);
Result<Capabilities> decode_capabilities(std::span<const std::byte> block, std::size_t* used = nullptr);
/// The GPU details of Capabilities (gpu_devices, gpu_regions), which WELCOME carries last in the
/// same block, after the session fields (older decoders stop before them): `u16 n · n × (str16
/// name, u32 sm, u32 multiprocessors, u64 memory, i32 numa) · u16 m · m × (str16 name, u64 size,
/// u32 device)`. Decoding refuses counts the bytes cannot hold and bytes after the lists.
std::vector<std::byte> encode_gpu_details(const Capabilities& caps);
Result<void> decode_gpu_details(std::span<const std::byte> bytes, Capabilities& caps);

Encoded encode_hello(std::string_view client);
Encoded encode_welcome(const Welcome& w);
/// `compact`: in the compact form (kFlagCompact) when `r` is a direct call it can carry (for an
/// agent that reads it); else, and by default, the full form.
Encoded encode_run(std::uint64_t id, const Run& r, bool compact = false);
/// encode_run, but the arguments are not copied: a split message that sends `r.args` from
/// where they lie, which `keep` holds until UCX is done with them. The same bytes arrive.
Encoded encode_run_borrowing_args(std::uint64_t id, const Run& r, std::shared_ptr<const void> keep);
Encoded encode_need_code(std::uint64_t id, const CodeHash& hash);
Encoded encode_result(std::uint64_t id, std::vector<std::byte> bytes);
/// A RESULT whose bytes are sent from where they lie, which `keep` holds until they are sent.
Encoded encode_result(std::uint64_t id, std::span<const std::byte> bytes, std::shared_ptr<const void> keep);
/// A RESULT whose bytes the agent wrote into the session's bulk window.
Encoded encode_window_result(std::uint64_t id, const WindowSpan& where);
Encoded encode_error(std::uint64_t id, Errc code, std::string_view message, std::int32_t kernel_code = 0);
Encoded encode_ping(Type type, std::uint64_t id, std::span<const std::byte> bytes);
Encoded encode_stats(std::uint64_t id);
Encoded encode_region(std::uint64_t id, std::string_view name);
Encoded encode_region_info(std::uint64_t id, const RegionInfo& info);
Encoded encode_gpu_read(std::uint64_t id, const GpuRead& r);
Encoded encode_gpu_write(std::uint64_t id, const GpuWrite& w);
Encoded encode_stats_reply(std::uint64_t id, std::span<const std::pair<std::string, std::uint64_t>> counters);
/// A BATCH carries whole messages (a Header, then its payload) back to back. The sending
/// engine makes one when many small messages go to one peer at once (Engine::Cork); the
/// receiving engine opens it and hands each message on as if it had come alone.
inline constexpr std::size_t kBatchMaxItems = 512;
struct BatchItem {
    Header header;
    std::span<const std::byte> payload; ///< a view into the BATCH's payload
};
/// The messages in a BATCH payload, each header checked as decode_header checks one. Refuses
/// an empty batch, a message cut short, a BATCH inside a BATCH and more than kBatchMaxItems.
Result<std::vector<BatchItem>> split_batch(std::span<const std::byte> payload);
/// Adds `item` (header and payload) to the end of `batch`, a BATCH being built.
void append_to_batch(Encoded& batch, const Encoded& item);

/// A group's answers (a RESULT of a kFlagEach RUN): `u32 count`, then per call, in order,
/// either `u8 0 · u32 n · n bytes` (its result) or `u8 1 · u32 errc · i32 kernel_code · str16
/// message` (its error).
class EachResultsWriter {
public:
    EachResultsWriter(std::uint32_t count, std::size_t reserve_bytes);
    void result(std::span<const std::byte> bytes);
    void error(Errc code, std::int32_t kernel_code, std::string_view message);
    /// Bytes written so far.
    [[nodiscard]] std::size_t size() const noexcept { return w_.size(); }
    std::vector<std::byte> take() && { return std::move(w_).take(); }

private:
    ByteWriter w_;
};
/// One call's answer in a group's RESULT.
struct EachAnswer {
    std::span<const std::byte> bytes; ///< its result, when `error` is not set
    std::optional<ErrorMsg> error;
};
/// Where each call's answer starts in a group's RESULT. Refuses another count than `expected`,
/// an answer cut short, an unknown outcome byte and bytes after the last answer.
Result<std::vector<std::uint32_t>> index_each_results(std::span<const std::byte> bytes, std::uint32_t expected);
/// The answer starting at `at`, an offset index_each_results gave for these bytes.
EachAnswer read_each_answer(std::span<const std::byte> bytes, std::uint32_t at) noexcept;

/// A request with no body: info, kernel_stats, cache_list, drain, window; and an empty BATCH.
Encoded encode_request(Type type, std::uint64_t id);
Encoded encode_info_reply(std::uint64_t id, const Fields& f);
Encoded encode_kernel_stats_reply(std::uint64_t id, const KernelStatsReply& s);
Encoded encode_cache_list_reply(std::uint64_t id, const CacheList& c);
Encoded encode_cache_evict(std::uint64_t id, const CodeHash& hash);
Encoded encode_ack(std::uint64_t id, bool done, std::string_view note);
Encoded encode_auth(std::uint64_t id, const Auth& a);

} // namespace bitship::wire
