#pragma once
// What the GPU device tests share: byte helpers, a pattern that catches misplaced chunks, and a
// GpuDevice opened on the in-process fake driver.

#include "cuda_api.hpp"
#include "fake_cuda/recording_driver.hpp"
#include "gpu_device.hpp"

#include <algorithm>
#include <bitship/bundle.hpp>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace bitship::test {

inline CodeHash hash_of(const std::string& text) {
    return hash_code(std::as_bytes(std::span(text.data(), text.size())));
}

template <class T> std::span<const std::byte> bytes_of(const std::vector<T>& v) {
    return std::as_bytes(std::span(v));
}

inline std::uint64_t u64_at(const Bytes& b, std::size_t i = 0) {
    std::uint64_t v = 0;
    std::memcpy(&v, b.data() + i * 8, 8);
    return v;
}

/// A pattern that differs at every offset of a few MiB (no period a chunk size divides).
inline std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
    std::vector<std::byte> out(n);
    std::uint32_t x = seed * 2654435761u + 1;
    for (auto& b : out) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        b = static_cast<std::byte>(x);
    }
    return out;
}

inline bool all_zero(std::span<const std::byte> b) {
    return std::all_of(b.begin(), b.end(), [](std::byte x) { return x == std::byte{0}; });
}

/// A GpuDevice on the test's fake driver.
inline std::unique_ptr<agent::GpuDevice> open_fake(fake::Scope& fake) {
    auto gpu = agent::GpuDevice::open(fake.table, 0);
    INFO((gpu ? std::string() : gpu.error().describe()));
    REQUIRE(gpu);
    return std::move(*gpu);
}

/// A sum_u64 kernel's arguments.
inline std::vector<std::uint64_t> sum_args(std::uint64_t a, std::uint64_t b) {
    return {a, b};
}

/// Loads the fake driver's kernels (fake::kFakePtx) into `gpu`: their module's hash.
inline CodeHash load_fake_kernels(agent::GpuDevice& gpu) {
    const auto hash = hash_of(fake::kFakePtx);
    REQUIRE(gpu.load_module(hash, fake::kFakePtx));
    return hash;
}

/// sum_u64 of `a` and `b` on `gpu` gives their sum: the device works.
inline void check_sum(agent::GpuDevice& gpu, const CodeHash& hash, std::uint64_t a,
                      std::uint64_t b) {
    using namespace std::chrono_literals;
    auto sum = gpu.launch(hash, "sum_u64", bytes_of(sum_args(a, b)), 8, agent::GpuGeometry{}, 1s);
    INFO((sum ? std::string() : sum.error().describe()));
    REQUIRE(sum);
    CHECK(u64_at(*sum) == a + b);
}

} // namespace bitship::test
