// GPU region reads and writes (GpuDevice::read, write): by DMA straight to or from host memory
// that pin() registered (bitship-gpu's window with the agent), else staged through two pinned
// host buffers, double-buffered, so the DMA of one chunk overlaps the host's copy of the other.
#include "gpu_device_impl.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

namespace bitship::agent {

using cuda::CUdeviceptr;
using cuda::CUresult;

/// Waits until the last copy that used `s` is done: before the host writes it, or reads it.
Result<void> GpuDevice::Impl::settle(Staging& s) {
    if (!s.pending) return {};
    s.pending = false;
    if (CUresult r = cu.cuEventSynchronize(s.done); r != cuda::kSuccess)
        return tl::make_unexpected(failed("cuEventSynchronize", r));
    return {};
}

bool GpuDevice::Impl::is_pinned(std::span<const std::byte> host) const noexcept {
    if (pinned.empty() || host.empty()) return false;
    const auto begin = reinterpret_cast<std::uintptr_t>(pinned.data());
    const auto at = reinterpret_cast<std::uintptr_t>(host.data());
    return at >= begin && at - begin <= pinned.size() && host.size() <= pinned.size() - (at - begin);
}

// Host to device through the staging buffers, alternating: the host copies chunk i+1 into one
// while the DMA engine reads chunk i from the other. Pinned memory goes in one DMA with no copy.
// The last copies may still run on return (stream order keeps later work behind them; the host
// waits before touching a staging buffer again, and the owner of pinned memory keeps it as it
// is until its call returns, which synchronizes the stream).
Result<void> GpuDevice::Impl::upload(CUdeviceptr to, std::span<const std::byte> from) {
    if (is_pinned(from)) {
        if (CUresult r = cu.cuMemcpyHtoDAsync(to, from.data(), from.size(), stream); r != cuda::kSuccess)
            return tl::make_unexpected(failed("cuMemcpyHtoDAsync", r));
        return {};
    }
    for (std::size_t done = 0; done < from.size();) {
        Staging& s = staging[next_staging];
        next_staging ^= 1;
        const std::size_t n = std::min(kStagingBytes, from.size() - done);
        if (auto r = settle(s); !r) return r;
        std::memcpy(s.host.get(), from.data() + done, n);
        if (CUresult r = cu.cuMemcpyHtoDAsync(to + done, s.host.get(), n, stream);
            r != cuda::kSuccess)
            return tl::make_unexpected(failed("cuMemcpyHtoDAsync", r));
        if (CUresult r = cu.cuEventRecord(s.done, stream); r != cuda::kSuccess)
            return tl::make_unexpected(failed("cuEventRecord", r));
        s.pending = true;
        done += n;
    }
    return {};
}

// Device to host through the staging buffers: two chunks in flight, and while the host copies
// chunk i out of one buffer the DMA engine fills the other with chunk i+1. Every copy is done
// on return.
Result<void> GpuDevice::Impl::download(CUdeviceptr from, std::span<std::byte> to) {
    if (is_pinned(to)) {
        if (CUresult r = cu.cuMemcpyDtoHAsync(to.data(), from, to.size(), stream); r != cuda::kSuccess)
            return tl::make_unexpected(failed("cuMemcpyDtoHAsync", r));
        if (CUresult r = cu.cuStreamSynchronize(stream); r != cuda::kSuccess)
            return tl::make_unexpected(failed("cuStreamSynchronize", r));
        return {};
    }
    const std::size_t chunks = (to.size() + kStagingBytes - 1) / kStagingBytes;
    const std::size_t first = next_staging;
    auto chunk_size = [&](std::size_t i) {
        return std::min(kStagingBytes, to.size() - i * kStagingBytes);
    };
    auto enqueue = [&](std::size_t i) -> Result<void> {
        Staging& s = staging[(first + i) % 2];
        // No wait for an upload still reading this buffer: the copy queues behind it on the stream.
        if (CUresult r =
                cu.cuMemcpyDtoHAsync(s.host.get(), from + i * kStagingBytes, chunk_size(i), stream);
            r != cuda::kSuccess)
            return tl::make_unexpected(failed("cuMemcpyDtoHAsync", r));
        if (CUresult r = cu.cuEventRecord(s.done, stream); r != cuda::kSuccess)
            return tl::make_unexpected(failed("cuEventRecord", r));
        s.pending = true;
        return {};
    };
    for (std::size_t i = 0; i < std::min<std::size_t>(chunks, 2); ++i)
        if (auto r = enqueue(i); !r) return r;
    for (std::size_t i = 0; i < chunks; ++i) {
        Staging& s = staging[(first + i) % 2];
        if (auto r = settle(s); !r) return r;
        std::memcpy(to.data() + i * kStagingBytes, s.host.get(), chunk_size(i));
        if (i + 2 < chunks)
            if (auto r = enqueue(i + 2); !r) return r;
    }
    next_staging = (first + chunks) % 2;
    return {};
}

namespace {

/// The region `name` when [offset, offset + size) lies in it (checked without overflow);
/// invalid_argument naming what does not hold otherwise. With the device's mutex held.
Result<const GpuDevice::Impl::Region*> checked_region(const GpuDevice::Impl& d, std::string_view name,
                                                      std::uint64_t offset, std::uint64_t size) {
    const auto* region = d.find_region(name);
    if (region == nullptr) return fail(Errc::invalid_argument, fmt::format("{}: no region '{}'", d.where, name));
    if (offset > region->size || size > region->size - offset)
        return fail(Errc::invalid_argument, fmt::format("{}: {} bytes at offset {} are outside region '{}' of {} bytes",
                                                        d.where, size, offset, name, region->size));
    return region;
}

} // namespace

Result<void> GpuDevice::pin(std::span<std::byte> memory) {
    Impl& d = *impl_;
    std::lock_guard lock(d.mutex);
    if (auto r = d.ready(); !r) return r;
    if (!d.pinned.empty()) {
        if (CUresult r = d.cu.cuStreamSynchronize(d.stream); r != cuda::kSuccess)
            return tl::make_unexpected(d.failed("cuStreamSynchronize", r));
        d.cu.cuMemHostUnregister(d.pinned.data());
        d.pinned = {};
    }
    if (memory.empty()) return {};
    if (CUresult r = d.cu.cuMemHostRegister(memory.data(), memory.size(), cuda::kMemHostRegisterPortable);
        r != cuda::kSuccess)
        return tl::make_unexpected(d.refused("cuMemHostRegister", r, Errc::no_device));
    d.pinned = memory;
    return {};
}

Result<void> GpuDevice::read(std::string_view name, std::uint64_t offset, std::span<std::byte> out) {
    Impl& d = *impl_;
    std::lock_guard lock(d.mutex);
    auto region = checked_region(d, name, offset, out.size());
    if (!region) return tl::make_unexpected(region.error());
    if (out.empty()) return {};
    if (auto r = d.ready(); !r) return r;
    return d.download((*region)->pointer + offset, out);
}

Result<void> GpuDevice::write(std::string_view name, std::uint64_t offset, std::span<const std::byte> in) {
    Impl& d = *impl_;
    std::lock_guard lock(d.mutex);
    auto region = checked_region(d, name, offset, in.size());
    if (!region) return tl::make_unexpected(region.error());
    if (in.empty()) return {};
    if (auto r = d.ready(); !r) return r;
    if (auto r = d.upload((*region)->pointer + offset, in); !r) return r;
    // Done when it returns: the caller may reuse `in`'s memory, and the staging buffers are free.
    if (CUresult r = d.cu.cuStreamSynchronize(d.stream); r != cuda::kSuccess)
        return tl::make_unexpected(d.failed("cuStreamSynchronize", r));
    return {};
}

} // namespace bitship::agent
