// Jit::compile_ptx: a GPU slice's PTX made where CPU code is compiled (in this process, or in a
// confined bitship-compiler process: the same text either way), checked like a CPU slice, made
// once per (hash, sm) and kept in memory and in the disk cache. The sample kernel gpu_reduce_u64
// calls nothing of libdevice, so these run without the CUDA Toolkit; the one that needs
// libdevice (gpu_exp_f32) warns and stops where find_libdevice() finds none.
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include <bitship/bundle.hpp>
#include <ptx_cache_kernels.hpp>
#include <gpu_test_kernels.hpp>

#include "jit.hpp"
#include "jit_fixtures.hpp"
#include "ptx_cache.hpp"
#include "ptx_compile.hpp"

namespace ptx_cache_test_cpp {

using namespace bitship;
using namespace bitship::jit_test;

namespace {

constexpr unsigned kHopper = 90;
constexpr unsigned kAmpere = 80;

/// A bundle (x86_64 and nvptx64 slices) and the hash of one of its slices.
struct Slice {
    std::vector<std::byte> bundle;
    CodeHash hash{};
};

Slice slice_of(std::span<const std::byte> bundle, std::string_view triple) {
    auto view = BundleView::parse(bundle);
    REQUIRE(view);
    auto index = view->find_slice(triple);
    REQUIRE(index);
    return {std::vector<std::byte>(bundle.begin(), bundle.end()), view->slices[*index].hash};
}

Slice gpu_reduce() { return slice_of(ptx_cache_kernels::bundle(), kGpuTriple); }

std::unique_ptr<jit::Jit> make_jit_in(jit::CompilerMode mode, fs::path cache_dir = {}) {
    jit::JitOptions o;
    o.exports = runtime_exports();
    o.cache_dir = std::move(cache_dir);
    o.compiler.mode = mode;
    o.compiler.path = BITSHIP_COMPILER_PROGRAM;
    o.compiler.processes = 1;
    auto j = jit::Jit::create(std::move(o));
    if (!j) FAIL("Jit::create: " << j.error().describe());
    return std::move(*j);
}

std::string ptx_of(jit::Jit& j, std::span<const std::byte> bundle, const CodeHash& hash, unsigned sm = kHopper) {
    auto ptx = j.compile_ptx(bundle, hash, sm);
    if (!ptx) FAIL("compile_ptx: " << ptx.error().describe());
    REQUIRE(*ptx);
    return **ptx;
}

std::string read_text(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_text(const fs::path& p, const std::string& text) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out << text;
    REQUIRE(out.good());
}

fs::path ptx_file(const fs::path& dir, const CodeHash& hash, unsigned sm) {
    return dir / (to_hex(hash) + ".sm" + std::to_string(sm) + ".ptx");
}

} // namespace

TEST_CASE("ptx cache: a GPU slice becomes PTX with an .entry per kernel - the same text in-process and in a compiler process", "[integration]") {
    const auto s = gpu_reduce();
    auto in_process = make_jit_in(jit::CompilerMode::in_process);
    auto confined = make_jit_in(jit::CompilerMode::process);
    const std::string a = ptx_of(*in_process, s.bundle, s.hash);
    const std::string b = ptx_of(*confined, s.bundle, s.hash);
    CHECK(a.find(".entry gpu_reduce_u64") != std::string::npos);
    CHECK(a.find(".target sm_90") != std::string::npos);
    CHECK(a == b);
    CHECK(in_process->ptx_compiles() == 1);
    CHECK(confined->ptx_compiles() == 1);
}

TEST_CASE("ptx cache: a second call is served from memory and GPUs past sm_90 share its PTX", "[unit]") {
    const auto s = gpu_reduce();
    auto j = make_jit();
    auto first = j->compile_ptx(s.bundle, s.hash, kHopper);
    REQUIRE(first);
    auto again = j->compile_ptx(s.bundle, s.hash, kHopper);
    REQUIRE(again);
    CHECK(again->get() == first->get()); // the same text, not a copy: no new compile
    auto newer = j->compile_ptx({}, s.hash, 100);
    REQUIRE(newer);
    CHECK(newer->get() == first->get());
    CHECK(j->ptx_compiles() == 1);

    // Another architecture is another compile.
    auto ampere = j->compile_ptx(s.bundle, s.hash, kAmpere);
    REQUIRE(ampere);
    CHECK((*ampere)->find(".target sm_80") != std::string::npos);
    CHECK(j->ptx_compiles() == 2);

    SECTION("evict drops it from memory: with no disk cache it is compiled again") {
        CHECK(j->evict(s.hash));
        CHECK_FALSE(j->evict(s.hash));
        auto remade = j->compile_ptx(s.bundle, s.hash, kHopper);
        REQUIRE(remade);
        CHECK(**remade == **first);
        CHECK(j->ptx_compiles() == 3);
    }
}

TEST_CASE("ptx cache: concurrent first calls for one hash and sm compile once", "[unit]") {
    const auto s = gpu_reduce();
    auto j = make_jit_in(jit::CompilerMode::process);
    constexpr int kThreads = 6;
    std::vector<std::shared_ptr<const std::string>> got(kThreads);
    std::atomic<int> failures{0};
    std::atomic<bool> go{false};
    {
        std::vector<std::jthread> threads;
        for (int i = 0; i < kThreads; ++i)
            threads.emplace_back([&, i] {
                while (!go.load()) std::this_thread::yield();
                auto ptx = j->compile_ptx(s.bundle, s.hash, kHopper);
                if (ptx) got[i] = *ptx;
                else ++failures;
            });
        go.store(true);
    }
    CHECK(failures == 0);
    CHECK(j->ptx_compiles() == 1);
    for (const auto& p : got) CHECK(p.get() == got.front().get());
}

TEST_CASE("ptx cache: a restarted Jit takes PTX from its disk cache without the bundle", "[unit]") {
    TempDir dir;
    const auto s = gpu_reduce();
    std::string made;
    {
        auto j = make_jit(dir.path);
        made = ptx_of(*j, s.bundle, s.hash);
        CHECK(j->on_disk(s.hash));
    }
    const fs::path file = ptx_file(dir.path, s.hash, kHopper);
    REQUIRE(fs::exists(file));
    CHECK(read_text(file).starts_with("// bitship-ptx 2 llvm "));
    CHECK(fs::exists(dir.path / (to_hex(s.hash) + ".bundle")));

    auto j = make_jit(dir.path);
    CHECK(j->on_disk(s.hash)); // no need to ask the client for the code again
    CHECK(ptx_of(*j, {}, s.hash) == made);
    CHECK(j->ptx_compiles() == 0);

    SECTION("another sm is compiled from the kept bundle") {
        auto ampere = j->compile_ptx({}, s.hash, kAmpere);
        REQUIRE(ampere);
        CHECK((*ampere)->find(".target sm_80") != std::string::npos);
        CHECK(j->ptx_compiles() == 1);
        CHECK(fs::exists(ptx_file(dir.path, s.hash, kAmpere)));
    }
    SECTION("after evict it comes from disk again, not from the compiler") {
        CHECK(j->evict(s.hash));
        CHECK(ptx_of(*j, {}, s.hash) == made);
        CHECK(j->ptx_compiles() == 0);
    }
    SECTION("load() of a GPU hash is no_matching_slice and leaves its files alone") {
        auto loaded = j->load(s.hash);
        REQUIRE_FALSE(loaded);
        CHECK(loaded.error().code == Errc::no_matching_slice);
        CHECK(j->on_disk(s.hash));
        CHECK(fs::exists(file));
    }
    SECTION("a compiler process reads the same files") {
        auto confined = make_jit_in(jit::CompilerMode::process, dir.path);
        CHECK(ptx_of(*confined, {}, s.hash) == made);
        CHECK(confined->ptx_compiles() == 0);
    }
}

TEST_CASE("ptx cache: a torn or stale PTX file is refused and made again from the bundle", "[unit]") {
    TempDir dir;
    const auto s = gpu_reduce();
    std::string made;
    {
        auto j = make_jit(dir.path);
        made = ptx_of(*j, s.bundle, s.hash);
    }
    const fs::path file = ptx_file(dir.path, s.hash, kHopper);
    const std::string good = read_text(file);
    SECTION("altered PTX") {
        std::string bad = good;
        bad[bad.size() / 2] ^= 1;
        write_text(file, bad);
    }
    SECTION("torn") { write_text(file, good.substr(0, good.size() / 2)); }
    SECTION("made by another LLVM") {
        write_text(file, "// bitship-ptx 2 llvm 18.1.8" + good.substr(good.find(" sm_")));
    }
    SECTION("made with another libdevice (a CUDA toolkit upgrade)") {
        const auto at = good.find(" libdevice ") + std::string(" libdevice ").size();
        std::string other = good;
        other.replace(at, good.find(' ', at) - at, "0123456789abcdef");
        REQUIRE(other != good);
        write_text(file, other);
    }
    SECTION("an older format") {
        write_text(file, "// bitship-ptx 1 llvm 19.1.7" + good.substr(good.find(" sm_")));
    }
    auto j = make_jit(dir.path);
    CHECK(ptx_of(*j, {}, s.hash) == made);
    CHECK(j->ptx_compiles() == 1);
    CHECK(read_text(file) == good); // replaced by a good one
}

TEST_CASE("ptx cache: a PTX file names what it was made by and for", "[unit]") {
    const auto s = gpu_reduce();
    const std::byte some_libdevice[3]{std::byte{1}, std::byte{2}, std::byte{3}};
    const std::string libdevice = jit::libdevice_id(some_libdevice);
    CHECK(libdevice.size() == 16);
    CHECK(jit::libdevice_id({}) == "none");
    const std::string file = jit::encode_ptx_file(".version 8.5\n", s.hash, kHopper, libdevice);
    CHECK_THAT(file, Catch::StartsWith("// bitship-ptx 2 llvm ") && Catch::Contains(" libdevice " + libdevice + " slice "));
    auto ok = jit::decode_ptx_file(file, s.hash, kHopper, libdevice);
    REQUIRE(ok);
    CHECK(*ok == ".version 8.5\n");

    auto other_libdevice = jit::decode_ptx_file(file, s.hash, kHopper, "none");
    REQUIRE_FALSE(other_libdevice);
    CHECK_THAT(other_libdevice.error().message, Catch::Contains("libdevice " + libdevice) && Catch::Contains("is none"));

    auto older = jit::decode_ptx_file("// bitship-ptx 1 llvm 19.1.7 sm_90 slice 00 digest 00\n.version 8.5\n", s.hash, kHopper,
                                      libdevice);
    REQUIRE_FALSE(older);
    CHECK_THAT(older.error().message, Catch::Contains("format 1 (this agent writes 2)"));

    auto other_sm = jit::decode_ptx_file(file, s.hash, kAmpere, libdevice);
    REQUIRE_FALSE(other_sm);
    CHECK(other_sm.error().code == Errc::malformed_bundle);
    CHECK_THAT(other_sm.error().message, Catch::Contains("sm_90") && Catch::Contains("sm_80"));

    CodeHash other{};
    auto other_slice = jit::decode_ptx_file(file, other, kHopper, libdevice);
    REQUIRE_FALSE(other_slice);
    CHECK_THAT(other_slice.error().message, Catch::Contains("another slice"));

    auto old = jit::decode_ptx_file("// bitship-ptx 2 llvm 18.1.8" + file.substr(file.find(" sm_")), s.hash, kHopper, libdevice);
    REQUIRE_FALSE(old);
    CHECK_THAT(old.error().message, Catch::Contains("LLVM 18.1.8") && Catch::Contains(to_string(jit::host().llvm)));

    auto headless = jit::decode_ptx_file(".version 8.5\n", s.hash, kHopper, libdevice);
    REQUIRE_FALSE(headless);
    CHECK(headless.error().code == Errc::malformed_bundle);
}

TEST_CASE("ptx cache: a CPU slice's hash is no_matching_slice naming its triple - in-process and in a compiler process", "[integration]") {
    const auto cpu = slice_of(ptx_cache_kernels::bundle(), "x86_64-unknown-linux-gnu");
    std::string in_process_message;
    for (auto mode : {jit::CompilerMode::in_process, jit::CompilerMode::process}) {
        auto j = make_jit_in(mode);
        auto refused = j->compile_ptx(cpu.bundle, cpu.hash, kHopper);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == Errc::no_matching_slice);
        CHECK_THAT(refused.error().message, Catch::Contains("x86_64-unknown-linux-gnu") && Catch::Contains("nvptx64"));
        if (mode == jit::CompilerMode::in_process) in_process_message = refused.error().message;
        else CHECK(refused.error().message == in_process_message);
    }
    // And the other way round: compile() of the GPU slice names the GPU.
    auto j = make_jit();
    const auto gpu = gpu_reduce();
    auto not_cpu = j->compile(gpu.bundle, gpu.hash);
    REQUIRE_FALSE(not_cpu);
    CHECK(not_cpu.error().code == Errc::no_matching_slice);
    CHECK_THAT(not_cpu.error().message, Catch::Contains("NVIDIA GPU"));
}

TEST_CASE("ptx cache: a corrupt bundle is malformed_bundle and nothing is kept", "[unit]") {
    TempDir dir;
    auto s = gpu_reduce();
    auto view = BundleView::parse(s.bundle);
    REQUIRE(view);
    auto index = view->find_slice(kGpuTriple);
    REQUIRE(index);
    const auto at = static_cast<std::size_t>(view->slices[*index].bitcode.data() - s.bundle.data()) + 40;
    auto flipped = s.bundle;
    flipped[at] ^= std::byte{0x20};
    const auto cut = std::span<const std::byte>(s.bundle).first(s.bundle.size() / 2);
    for (auto mode : {jit::CompilerMode::in_process, jit::CompilerMode::process}) {
        auto j = make_jit_in(mode, dir.path);
        for (std::span<const std::byte> bad : {std::span<const std::byte>(flipped), cut}) {
            auto refused = j->compile_ptx(bad, s.hash, kHopper);
            REQUIRE_FALSE(refused);
            CHECK(refused.error().code == Errc::malformed_bundle);
        }
        CHECK_FALSE(j->on_disk(s.hash));
        CHECK(j->ptx_compiles() == 0);
    }
}

TEST_CASE("ptx cache: no bundle and none on disk is code_missing and an sm below 20 is invalid_argument", "[unit]") {
    const auto s = gpu_reduce();
    auto memory_only = make_jit();
    auto missing = memory_only->compile_ptx({}, s.hash, kHopper);
    REQUIRE_FALSE(missing);
    CHECK(missing.error().code == Errc::code_missing);

    TempDir dir;
    auto with_disk = make_jit(dir.path);
    auto not_there = with_disk->compile_ptx({}, s.hash, kHopper);
    REQUIRE_FALSE(not_there);
    CHECK(not_there.error().code == Errc::code_missing);

    auto ancient = with_disk->compile_ptx(s.bundle, s.hash, 13);
    REQUIRE_FALSE(ancient);
    CHECK(ancient.error().code == Errc::invalid_argument);
    CHECK_THAT(ancient.error().message, Catch::Contains("sm_13"));
}

TEST_CASE("ptx cache: a kernel that calls libdevice is linked with it - in-process and in a compiler process", "[integration]") {
    const auto s = slice_of(gpu_test_kernels::bundle(), kGpuTriple);
    if (jit::find_libdevice().empty()) {
        // Without libdevice the call is refused, naming it; the rest needs the CUDA Toolkit.
        auto j = make_jit();
        auto refused = j->compile_ptx(s.bundle, s.hash, kHopper);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == Errc::no_device);
        WARN("no libdevice.10.bc (CUDA_HOME, CUDA_PATH, /usr/local/cuda): libdevice through compile_ptx not checked");
        return;
    }
    auto in_process = make_jit_in(jit::CompilerMode::in_process);
    auto confined = make_jit_in(jit::CompilerMode::process);
    const std::string a = ptx_of(*in_process, s.bundle, s.hash);
    const std::string b = ptx_of(*confined, s.bundle, s.hash);
    CHECK(a.find(".entry gpu_exp_f32") != std::string::npos);
    CHECK(a.find(".entry gpu_reduce_u64") != std::string::npos);
    CHECK(a.find("__nv_expf") == std::string::npos); // linked and inlined, not called
    CHECK(a.find("__nvvm_reflect") == std::string::npos);
    CHECK(a == b);

    SECTION("a libdevice file that cannot be read is an error at create(), naming it") {
        jit::JitOptions o;
        o.exports = runtime_exports();
        o.libdevice = "/nonexistent/libdevice.10.bc";
        auto j = jit::Jit::create(std::move(o));
        REQUIRE_FALSE(j);
        CHECK(j.error().code == Errc::no_device);
        CHECK_THAT(j.error().message, Catch::Contains("/nonexistent/libdevice.10.bc"));
    }
}

}  // namespace ptx_cache_test_cpp
