#include "kernel_sandbox.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "runtime.hpp"
#include "sandbox_arena.hpp"
#include "sandbox_runtime.hpp"

namespace bitship::agent {
namespace {
constexpr std::size_t kCanaryBytes = 64 * 1024;
constexpr std::byte kCanaryByte{0xa5};
} // namespace

Result<std::unique_ptr<KernelSandbox>> KernelSandbox::create(const SandboxConfig& config) {
    std::unique_ptr<KernelSandbox> box(new KernelSandbox(config));
    if (config.canary) {
        void* page = mmap(nullptr, kCanaryBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (page == MAP_FAILED)
            return fail(Errc::internal, fmt::format("mapping the sandbox canary: {}", std::strerror(errno)));
        box->canary_ = static_cast<std::byte*>(page);
        std::fill_n(box->canary_, kCanaryBytes, kCanaryByte);
    }
    if (config.mode == SandboxMode::none) return box;
    if (config.kernel_heap_mib == 0) return fail(Errc::invalid_argument, "--kernel-heap-mib must be at least 1");
    if (config.arena_log2 < 32 || config.arena_log2 > 44)
        return fail(Errc::invalid_argument,
                    fmt::format("sandbox arena of 2^{} bytes: choose between 2^32 (4 GiB) and 2^44 (16 TiB)", config.arena_log2));
    ArenaOptions ao;
    ao.size_log2 = config.arena_log2;
    ao.heap_bytes = config.kernel_heap_mib << 20;
    ao.call_buffer_bytes = std::max<std::size_t>(config.max_args, 4096);
    ao.max_threads = config.threads;
    auto arena = SandboxArena::reserve(ao);
    if (!arena) return tl::make_unexpected(arena.error());
    box->arena_ = std::move(*arena);
    return box;
}

KernelSandbox::KernelSandbox(SandboxConfig config) : config_(config) {}

KernelSandbox::~KernelSandbox() {
    if (canary_) munmap(canary_, kCanaryBytes);
}

void KernelSandbox::configure(jit::JitOptions& options) const {
    if (config_.mode == SandboxMode::none) {
        options.sandbox = jit::Sandbox::none;
        return;
    }
    options.sandbox = jit::Sandbox::sfi;
    options.zones = arena_->zones();
    // The checked versions replace the plain runtime's entries of the same name.
    auto checked = sandboxed_exports(*arena_);
    std::erase_if(options.exports, [&](const jit::Export& e) {
        return std::any_of(checked.begin(), checked.end(), [&](const jit::Export& c) { return c.name == e.name; });
    });
    options.exports.insert(options.exports.end(), checked.begin(), checked.end());
}

Result<void> KernelSandbox::enter(bs_ctx& ctx) const {
    if (config_.mode == SandboxMode::none) return {};
    return SandboxedCall::enter(*arena_, ctx);
}

void KernelSandbox::prepare_thread() const noexcept {
    if (config_.mode == SandboxMode::none) return;
    auto claimed = arena_->this_thread();
    if (!claimed) return; // the thread's first call reports it
    const ThreadArea& area = **claimed;
    // Fresh anonymous pages read as zero: writing a zero changes nothing but maps them.
    *static_cast<volatile std::byte*>(area.call_buffer) = std::byte{0};
    *static_cast<volatile std::byte*>(area.stack_top - 1) = std::byte{0};
}

void KernelSandbox::leave() const noexcept {
    if (config_.mode != SandboxMode::none) SandboxedCall::leave();
}

std::string KernelSandbox::summary() const {
    std::string out = to_string(config_.mode);
    if (arena_)
        out += fmt::format(" (arena {} GiB at {}; kernel heap {} MiB per call)", arena_->size() >> 30,
                           static_cast<const void*>(arena_->base()), config_.kernel_heap_mib);
    if (canary_) {
        bool intact = std::all_of(canary_, canary_ + kCanaryBytes, [](std::byte b) { return b == kCanaryByte; });
        out += fmt::format("; canary {} {}", static_cast<const void*>(canary_), intact ? "intact" : "CHANGED");
    }
    return out;
}

} // namespace bitship::agent
