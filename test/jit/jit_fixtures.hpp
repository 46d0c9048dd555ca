#pragma once
// What the JIT's unit tests share: a Jit made with the test runtime's exports, a test kernel's
// bundle, calling the `add` kernel, and a temporary directory.

#include <array>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include <catch2/catch.hpp>

#include "jit.hpp"
#include "test_runtime.hpp"

namespace bitship::jit_test {

namespace fs = std::filesystem;


inline std::unique_ptr<jit::Jit> make_jit(fs::path cache_dir = {}, unsigned opt_level = 2, unsigned tiers = 2,
                                   std::size_t cache_mib = 0, std::size_t cache_disk_mib = 0) {
    jit::JitOptions options;
    options.exports = jit_test::runtime_exports();
    options.opt_level = opt_level;
    options.cache_dir = std::move(cache_dir);
    options.tiers = tiers;
    options.cache_mib = cache_mib;
    options.cache_disk_mib = cache_disk_mib;
    auto j = jit::Jit::create(std::move(options));
    if (!j) FAIL("Jit::create: " << j.error().describe());
    return std::move(*j);
}

inline Bundle kernel_bundle(const std::string& name, std::vector<std::string> entries) {
    return make_bundle(kernel_bitcode(name), std::move(entries));
}

template <class T> std::vector<std::byte> as_bytes_of(const T& value) {
    std::vector<std::byte> out(sizeof value);
    std::memcpy(out.data(), &value, sizeof value);
    return out;
}

inline std::uint64_t run_add(const jit::CompiledCode& code, std::uint64_t a, std::uint64_t b) {
    auto add = code.entry("add");
    REQUIRE(add);
    const std::array<std::uint64_t, 2> args{a, b};
    auto ctx = call(*add, std::as_bytes(std::span(args)));
    auto sum = reply_u64(ctx);
    REQUIRE(sum);
    return *sum;
}

/// A fresh directory under the system temp dir, removed with everything in it.
struct TempDir {
    fs::path path;
    TempDir() {
        static std::atomic<int> counter{0};
        path = fs::temp_directory_path() / ("bitship-jit-test-" + std::to_string(::getpid()) + "-" +
                                            std::to_string(counter++));
        fs::remove_all(path);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
};


} // namespace bitship::jit_test
