// The agent ⇄ bitship-gpu protocol (see gpu_process_protocol.hpp): encoding and bounds-checked
// decoding.
#include "gpu_process_protocol.hpp"

#include "core/byte_io.hpp"

#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utility>

namespace bitship::agent::gpu_protocol {
namespace {

/// Longest kernel, region or GPU name a message may carry.
constexpr std::size_t kMaxName = 4096;
/// A timeout longer than a year is a confused sender, not a patient one.
constexpr std::uint64_t kMaxTimeoutMs = 366ull * 24 * 3600 * 1000;

Error malformed(std::string_view what) {
    return Error{Errc::malformed_message, fmt::format("GPU process protocol: {}", what)};
}

ByteWriter start(Type type, std::size_t more = 0) {
    ByteWriter w;
    w.reserve(1 + more);
    w.u8(static_cast<std::uint8_t>(type));
    return w;
}

/// A reader past the type byte, once the frame is of `type`.
Result<ByteReader> open(std::span<const std::byte> frame, Type type) {
    auto t = type_of(frame);
    if (!t) return tl::make_unexpected(t.error());
    if (*t != type)
        return tl::make_unexpected(malformed(fmt::format(
            "expected message type {}, got {}", static_cast<int>(type), static_cast<int>(*t))));
    ByteReader r(frame);
    (void)r.u8();
    return r;
}

Result<void> at_end(const ByteReader& r, std::string_view what) {
    if (r.remaining() != 0)
        return tl::make_unexpected(
            malformed(fmt::format("{} bytes after {}", r.remaining(), what)));
    return {};
}

/// A u32-length string of at most `max` bytes.
std::optional<std::string> text(ByteReader& r, std::size_t max) {
    auto b = r.blob32();
    if (!b || b->size() > max) return std::nullopt;
    return std::string(reinterpret_cast<const char*>(b->data()), b->size());
}
void put_text(ByteWriter& w, std::string_view s) {
    w.blob32(std::as_bytes(std::span(s.data(), s.size())));
}

void put_hash(ByteWriter& w, const CodeHash& h) {
    w.raw(std::as_bytes(std::span(h)));
}
std::optional<CodeHash> hash(ByteReader& r) {
    auto b = r.bytes(sizeof(CodeHash));
    if (!b) return std::nullopt;
    CodeHash h;
    std::memcpy(h.data(), b->data(), h.size());
    return h;
}

void put_dims(ByteWriter& w, const std::uint32_t (&d)[3]) {
    for (auto v : d)
        w.u32(v);
}
bool dims(ByteReader& r, std::uint32_t (&d)[3]) {
    for (auto& v : d) {
        auto x = r.u32();
        if (!x) return false;
        v = *x;
    }
    return true;
}

Result<Transfer> decode_transfer(std::span<const std::byte> frame, Type type) {
    const char* what = type == Type::read ? "READ" : "WRITE";
    auto r = open(frame, type);
    if (!r) return tl::make_unexpected(r.error());
    auto region = text(*r, kMaxName);
    auto offset = r->u64();
    auto length = r->u64();
    auto at = r->u64();
    if (!region || !offset || !length || !at)
        return tl::make_unexpected(malformed(fmt::format("truncated {}", what)));
    if (*length > kWindowBytes)
        return tl::make_unexpected(malformed(
            fmt::format("a {} of {} bytes (the window holds {})", what, *length, kWindowBytes)));
    if (*at > kWindowTotalBytes || *length > kWindowTotalBytes - *at)
        return tl::make_unexpected(malformed(fmt::format(
            "a {} of {} bytes at {} of the window, which ends at {}", what, *length, *at, kWindowTotalBytes)));
    if (auto end = at_end(*r, what); !end) return tl::make_unexpected(end.error());
    return Transfer{std::move(*region), *offset, *length, *at};
}

std::vector<std::byte> encode_transfer(Type type, const Transfer& m) {
    auto w = start(type);
    put_text(w, m.region);
    w.u64(m.offset);
    w.u64(m.length);
    w.u64(m.at);
    return std::move(w).take();
}

} // namespace

Result<Window> Window::create() {
    int fd = ::memfd_create("bitship-gpu-window", MFD_CLOEXEC);
    if (fd < 0)
        return fail(Errc::io_error, fmt::format("memfd_create for the GPU process's window: {}",
                                                std::strerror(errno)));
    if (::ftruncate(fd, static_cast<off_t>(kWindowTotalBytes)) != 0) {
        const int e = errno;
        ::close(fd);
        return fail(Errc::io_error,
                    fmt::format("sizing the GPU process's window: {}", std::strerror(e)));
    }
    auto window = map(fd);
    if (!window) ::close(fd);
    return window;
}

Result<Window> Window::map(int fd) {
    struct stat st {};
    if (::fstat(fd, &st) != 0)
        return fail(Errc::io_error,
                    fmt::format("the GPU window (fd {}): {}", fd, std::strerror(errno)));
    if (static_cast<std::uint64_t>(st.st_size) != kWindowTotalBytes)
        return fail(Errc::invalid_argument,
                    fmt::format("the GPU window (fd {}) has {} bytes, not {}", fd, st.st_size,
                                kWindowTotalBytes));
    void* p = ::mmap(nullptr, kWindowTotalBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return fail(Errc::io_error,
                    fmt::format("mapping the GPU window: {}", std::strerror(errno)));
    return Window(fd, static_cast<std::byte*>(p), kWindowTotalBytes);
}

Window::Window(Window&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

Window::~Window() {
    if (data_ != nullptr) ::munmap(data_, size_);
    if (fd_ >= 0) ::close(fd_);
}

std::vector<std::byte> encode(const Ready& m) {
    auto w = start(Type::ready);
    w.u32(m.version);
    put_text(w, m.gpu.name);
    put_text(w, m.gpu.pci_bus_id);
    w.u32(m.gpu.sm);
    w.u32(m.gpu.limits.multiprocessors);
    w.u32(m.gpu.limits.max_threads_per_block);
    put_dims(w, m.gpu.limits.max_block);
    put_dims(w, m.gpu.limits.max_grid);
    w.u64(m.gpu.memory_bytes);
    return std::move(w).take();
}

std::vector<std::byte> encode(const AddRegion& m) {
    auto w = start(Type::add_region);
    put_text(w, m.name);
    w.u64(m.size);
    return std::move(w).take();
}

std::vector<std::byte> encode(const LoadModule& m) {
    auto w = start(Type::load_module, sizeof(CodeHash) + 4 + m.ptx.size());
    put_hash(w, m.hash);
    put_text(w, m.ptx);
    return std::move(w).take();
}

std::vector<std::byte> encode(const UnloadModule& m) {
    auto w = start(Type::unload_module, sizeof(CodeHash));
    put_hash(w, m.hash);
    return std::move(w).take();
}

std::vector<std::byte> encode(const Launch& m) {
    auto w = start(Type::launch, 128 + m.entry.size());
    put_hash(w, m.hash);
    put_text(w, m.entry);
    put_dims(w, m.geometry.grid);
    put_dims(w, m.geometry.block);
    w.u32(m.result_bytes);
    w.u64(static_cast<std::uint64_t>(std::max<std::int64_t>(m.timeout.count(), 0)));
    w.u64(m.args_bytes);
    return std::move(w).take();
}

std::vector<std::byte> encode_read(const Transfer& m) {
    return encode_transfer(Type::read, m);
}
std::vector<std::byte> encode_write(const Transfer& m) {
    return encode_transfer(Type::write, m);
}

std::vector<std::byte> encode_ok(std::uint64_t window_bytes) {
    auto w = start(Type::ok);
    w.u64(window_bytes);
    return std::move(w).take();
}

std::vector<std::byte> encode(const Failed& m) {
    auto w = start(Type::failed);
    w.u32(static_cast<std::uint32_t>(m.error.code));
    w.u8(m.poisoned ? 1 : 0);
    put_text(w, m.error.message);
    return std::move(w).take();
}

Result<Type> type_of(std::span<const std::byte> frame) {
    if (frame.empty()) return tl::make_unexpected(malformed("empty frame"));
    const auto t = static_cast<std::uint8_t>(frame[0]);
    if (t < static_cast<std::uint8_t>(Type::ready) || t > static_cast<std::uint8_t>(Type::unload_module))
        return tl::make_unexpected(malformed(fmt::format("unknown message type {}", t)));
    return static_cast<Type>(t);
}

Result<Ready> decode_ready(std::span<const std::byte> frame) {
    auto r = open(frame, Type::ready);
    if (!r) return tl::make_unexpected(r.error());
    Ready m;
    auto version = r->u32();
    if (!version) return tl::make_unexpected(malformed("truncated READY"));
    if (*version != kVersion)
        return tl::make_unexpected(malformed(
            fmt::format("the GPU process speaks version {}, the agent {}", *version, kVersion)));
    auto name = text(*r, kMaxName);
    auto bus = text(*r, kMaxName);
    auto sm = r->u32();
    auto mps = r->u32();
    auto threads = r->u32();
    if (!name || !bus || !sm || !mps || !threads || !dims(*r, m.gpu.limits.max_block) ||
        !dims(*r, m.gpu.limits.max_grid))
        return tl::make_unexpected(malformed("truncated READY"));
    auto memory = r->u64();
    if (!memory) return tl::make_unexpected(malformed("truncated READY"));
    if (auto end = at_end(*r, "READY"); !end) return tl::make_unexpected(end.error());
    m.gpu.name = std::move(*name);
    m.gpu.pci_bus_id = std::move(*bus);
    m.gpu.sm = *sm;
    m.gpu.limits.multiprocessors = *mps;
    m.gpu.limits.max_threads_per_block = *threads;
    m.gpu.memory_bytes = *memory;
    return m;
}

Result<AddRegion> decode_add_region(std::span<const std::byte> frame) {
    auto r = open(frame, Type::add_region);
    if (!r) return tl::make_unexpected(r.error());
    auto name = text(*r, kMaxName);
    auto size = r->u64();
    if (!name || !size) return tl::make_unexpected(malformed("truncated ADD_REGION"));
    if (auto end = at_end(*r, "ADD_REGION"); !end) return tl::make_unexpected(end.error());
    return AddRegion{std::move(*name), *size};
}

Result<LoadModule> decode_load_module(std::span<const std::byte> frame) {
    auto r = open(frame, Type::load_module);
    if (!r) return tl::make_unexpected(r.error());
    auto h = hash(*r);
    auto ptx = text(*r, kMaxPtxBytes);
    if (!h || !ptx)
        return tl::make_unexpected(malformed("truncated LOAD_MODULE (or PTX over its cap)"));
    if (auto end = at_end(*r, "LOAD_MODULE"); !end) return tl::make_unexpected(end.error());
    return LoadModule{*h, std::move(*ptx)};
}

Result<UnloadModule> decode_unload_module(std::span<const std::byte> frame) {
    auto r = open(frame, Type::unload_module);
    if (!r) return tl::make_unexpected(r.error());
    auto h = hash(*r);
    if (!h) return tl::make_unexpected(malformed("truncated UNLOAD_MODULE"));
    if (auto end = at_end(*r, "UNLOAD_MODULE"); !end) return tl::make_unexpected(end.error());
    return UnloadModule{*h};
}

Result<Launch> decode_launch(std::span<const std::byte> frame) {
    auto r = open(frame, Type::launch);
    if (!r) return tl::make_unexpected(r.error());
    Launch m;
    auto h = hash(*r);
    auto entry = text(*r, kMaxName);
    if (!h || !entry || !dims(*r, m.geometry.grid) || !dims(*r, m.geometry.block))
        return tl::make_unexpected(malformed("truncated LAUNCH"));
    auto result_bytes = r->u32();
    auto timeout = r->u64();
    auto args = r->u64();
    if (!result_bytes || !timeout || !args)
        return tl::make_unexpected(malformed("truncated LAUNCH"));
    if (*timeout > kMaxTimeoutMs)
        return tl::make_unexpected(malformed(fmt::format("a timeout of {} ms", *timeout)));
    if (*args > kWindowBytes || *result_bytes > kWindowBytes)
        return tl::make_unexpected(malformed(
            fmt::format("a launch of {} argument and {} result bytes (the window holds {})", *args,
                        *result_bytes, kWindowBytes)));
    if (auto end = at_end(*r, "LAUNCH"); !end) return tl::make_unexpected(end.error());
    m.hash = *h;
    m.entry = std::move(*entry);
    m.result_bytes = *result_bytes;
    m.timeout = std::chrono::milliseconds(*timeout);
    m.args_bytes = *args;
    return m;
}

Result<Transfer> decode_read(std::span<const std::byte> frame) {
    return decode_transfer(frame, Type::read);
}
Result<Transfer> decode_write(std::span<const std::byte> frame) {
    return decode_transfer(frame, Type::write);
}

Result<std::uint64_t> decode_ok(std::span<const std::byte> frame) {
    auto r = open(frame, Type::ok);
    if (!r) return tl::make_unexpected(r.error());
    auto bytes = r->u64();
    if (!bytes) return tl::make_unexpected(malformed("truncated OK"));
    if (*bytes > kWindowBytes)
        return tl::make_unexpected(
            malformed(fmt::format("OK of {} bytes (the window holds {})", *bytes, kWindowBytes)));
    if (auto end = at_end(*r, "OK"); !end) return tl::make_unexpected(end.error());
    return *bytes;
}

Result<Failed> decode_failed(std::span<const std::byte> frame) {
    auto r = open(frame, Type::failed);
    if (!r) return tl::make_unexpected(r.error());
    auto code = r->u32();
    auto poisoned = r->u8();
    auto message = text(*r, std::size_t{1} << 20);
    if (!code || !poisoned || *poisoned > 1 || !message)
        return tl::make_unexpected(malformed("truncated FAILED"));
    if (auto end = at_end(*r, "FAILED"); !end) return tl::make_unexpected(end.error());
    // A code this build does not know, or "ok" for a failure, is the process's confusion.
    const auto errc = *code == 0 || *code > static_cast<std::uint32_t>(kLastErrc)
                          ? Errc::internal
                          : static_cast<Errc>(*code);
    return Failed{Error{errc, std::move(*message)}, *poisoned == 1};
}

} // namespace bitship::agent::gpu_protocol
