#pragma once
// What the agent and a bitship-compiler process say to each other over their socket: frames of
// a u32 little-endian length and a payload whose first byte is its type. Both sides decode with
// bounds checks and size caps: the compiler reads shipped bitcode, so the agent treats every byte
// it sends back as hostile too. No LLVM here. Private to jit/.
//
//   agent                                   compiler
//   HELLO {version, opt level, sandbox, names, libdevice}  ──►  initialise LLVM, warm up, confine (seccomp)
//                                      ◄──  READY {confined, why not}
//   COMPILE {id, tier, target, sm, only, hash, bundle}  ──►  parse, verify, policy, optimise, codegen
//                                      ◄──  COMPILED {id, stats, tier, entries, left out, slice, object}
//                                           (target object), or
//                                           PTX_COMPILED {id, stats, slice, PTX} (target ptx), or
//                                           FAILED {id, code, message, fatal}
// A FAILED marked fatal (LLVM's fatal-error or out-of-memory handler) is the compiler's last
// word: it exits right after.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <bitship/bundle.hpp>
#include <bitship/errc.hpp>

#include "object_compiler.hpp"

namespace bitship::jit::compiler_protocol {

/// 2: HELLO carries the sandbox mode. 3: COMPILE names the one entry to compile, COMPILED the
/// entries it left out. 4: COMPILED says the tier it made (a slice that holds state is made
/// optimised whatever was asked). 5: COMPILE names its target (this host's object code, or PTX
/// for a GPU architecture), PTX_COMPILED answers the latter, HELLO carries libdevice (the
/// compiler opens no file once confined).
inline constexpr std::uint32_t kVersion = 5;
/// Caps on one frame: a request carries a bundle (the agent's own message cap applies first);
/// a reply an object. Anything longer is refused before a byte of it is allocated.
inline constexpr std::uint32_t kMaxRequestFrame = 1u << 30;
inline constexpr std::uint32_t kMaxReplyFrame = 512u << 20;
inline constexpr std::size_t kMaxEntries = 1u << 16;
inline constexpr std::size_t kMaxNames = 1u << 20;
/// libdevice.10.bc is about 0.5 MiB (CUDA 12); a HELLO claiming far more is refused.
inline constexpr std::size_t kMaxLibdeviceBytes = 64u << 20;
/// The compiler's fd for its end of the socket (stdin, stdout and stderr stay what they are).
inline constexpr int kCompilerFd = 3;

enum class Type : std::uint8_t { hello = 1, ready = 2, compile = 3, compiled = 4, failed = 5, compiled_ptx = 6 };

/// What a COMPILE asks for.
enum class Target : std::uint8_t {
    object = 0, ///< this host's relocatable object code (ObjectCompiler::compile): COMPILED
    ptx = 1,    ///< PTX for one GPU architecture (ObjectCompiler::compile_ptx): PTX_COMPILED
};

struct Hello {
    std::uint32_t version = kVersion;
    unsigned opt_level = 2;
    Sandbox sandbox = Sandbox::none;  ///< how every compile confines the code (sfi_pass.hpp)
    std::vector<std::string> allowed; ///< the allow-list's symbol names
    /// libdevice.10.bc's bytes, which PTX compiles link (read by the agent: the confined
    /// compiler cannot open files); empty when the agent has none.
    std::vector<std::byte> libdevice;
};

struct Ready {
    bool confined = false; ///< the seccomp filter is on
    std::string note;      ///< why not, when it is not
};

struct CompileRequest {
    std::uint64_t id = 0;
    Tier tier = Tier::fast;
    CodeHash expected{};
    std::span<const std::byte> bundle; ///< points into the decoded frame
    std::string_view only; ///< the one entry to compile (ObjectCompiler::compile); points into the frame
    /// Target::ptx asks for Tier::optimised (PTX is made at O3) and names no `only`.
    Target target = Target::object;
    /// Target::ptx: the GPU architecture, kMinPtxSm..kMaxPtxSm (ptx_compile.hpp); 0 for an object.
    unsigned sm = 0;
};

struct CompileReply {
    std::uint64_t id = 0;
    CompiledObject made;
};

struct PtxReply {
    std::uint64_t id = 0;
    CompiledPtx made; ///< its stats: verify_ms and codegen_ms only
};

struct CompileFailure {
    std::uint64_t id = 0;
    Error error;
    bool fatal = false; ///< the compiler exits after sending this
};

std::vector<std::byte> encode(const Hello& m);
std::vector<std::byte> encode(const Ready& m);
std::vector<std::byte> encode(const CompileRequest& m);
std::vector<std::byte> encode(const CompileReply& m);
std::vector<std::byte> encode(const PtxReply& m);
std::vector<std::byte> encode(const CompileFailure& m);

/// The type of a frame's payload, or malformed_message.
Result<Type> type_of(std::span<const std::byte> payload);
Result<Hello> decode_hello(std::span<const std::byte> payload);
Result<Ready> decode_ready(std::span<const std::byte> payload);
Result<CompileRequest> decode_compile(std::span<const std::byte> payload);
Result<CompileReply> decode_compiled(std::span<const std::byte> payload);
/// Refuses PTX that is empty or holds a NUL byte (the driver reads it as a C string).
Result<PtxReply> decode_compiled_ptx(std::span<const std::byte> payload);
Result<CompileFailure> decode_failed(std::span<const std::byte> payload);

/// Writes `payload` as one frame, whole (EINTR and short writes handled). io_error naming errno.
Result<void> write_frame(int fd, std::span<const std::byte> payload);

/// Reads one frame of at most `max` payload bytes. `deadline` (none: wait forever) bounds the
/// whole read: timeout when it passes. disconnected at end of file before a whole frame;
/// too_large for a longer frame (nothing of it is read).
Result<std::vector<std::byte>> read_frame(int fd, std::uint32_t max,
                                          std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt);

/// Writes a FAILED frame marked fatal from a handler that must not allocate (LLVM's fatal-error
/// and out-of-memory handlers): the message is cut to fit a fixed buffer. Async-signal-safe.
void write_fatal_frame(int fd, std::uint64_t id, Errc code, std::string_view message) noexcept;

} // namespace bitship::jit::compiler_protocol
