// The GPU compile chain without a GPU: the nvptx64 slice bitship_add_kernels() built for the
// sample GPU kernels becomes PTX (compile_to_ptx), which CUDA's own tools accept: ptxas for
// sm_90, and nvJitLink makes an sm_90 cubin of it. Where the CUDA Toolkit is absent, the checks
// that need it warn and return; everything before them still runs.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <bitship/bundle.hpp>
#include <gpu_ops_kernels.hpp> // test/gpu's kernels, which run on the GPU machine
#include <gpu_test_kernels.hpp>

#include "ptx_compile.hpp"

namespace ptx_test_cpp {

namespace fs = std::filesystem;
using namespace bitship;

namespace {

constexpr const char* kCudaHome = "/usr/local/cuda";

fs::path cuda_home() {
    for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
        if (const char* dir = std::getenv(var); dir && *dir) return dir;
    return kCudaHome;
}

using BundleFn = std::span<const std::byte> (*)() noexcept;

std::span<const std::byte> nvptx_slice(BundleFn bundle = gpu_test_kernels::bundle) {
    auto view = BundleView::parse(bundle());
    REQUIRE(view);
    auto index = view->find_slice("nvptx64-nvidia-cuda");
    REQUIRE(index);
    return view->slices[*index].bitcode;
}

struct TempDir {
    fs::path path;
    TempDir() {
        std::string tmpl = (fs::temp_directory_path() / "bitship-ptx-XXXXXX").string();
        REQUIRE(mkdtemp(tmpl.data()) != nullptr);
        path = tmpl;
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
};

void write_file(const fs::path& p, const std::string& text) {
    std::ofstream out(p, std::ios::binary);
    out << text;
    REQUIRE(out.good());
}

// Runs a shell command; its exit status (-1 when it did not exit normally).
int run(const std::string& command) {
    int status = std::system(command.c_str());
    return (status != -1 && WIFEXITED(status)) ? WEXITSTATUS(status) : -1;
}

std::string ptx_for(unsigned sm = 90, BundleFn bundle = gpu_test_kernels::bundle) {
    auto ptx = jit::compile_to_ptx(nvptx_slice(bundle), sm, jit::find_libdevice());
    if (!ptx) FAIL(ptx.error().describe());
    return *ptx;
}

// nvJitLink, loaded at run time like the agent will load the driver (never linked).
struct NvJitLink {
    using Handle = void*;
    void* lib = nullptr;
    int (*create)(Handle*, std::uint32_t, const char**) = nullptr;
    int (*add_data)(Handle, int, const void*, std::size_t, const char*) = nullptr;
    int (*complete)(Handle) = nullptr;
    int (*cubin_size)(Handle, std::size_t*) = nullptr;
    int (*error_log_size)(Handle, std::size_t*) = nullptr;
    int (*error_log)(Handle, char*) = nullptr;
    int (*destroy)(Handle*) = nullptr;

    explicit NvJitLink(const fs::path& so) {
        lib = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!lib) return;
        create = reinterpret_cast<decltype(create)>(dlsym(lib, "nvJitLinkCreate"));
        add_data = reinterpret_cast<decltype(add_data)>(dlsym(lib, "nvJitLinkAddData"));
        complete = reinterpret_cast<decltype(complete)>(dlsym(lib, "nvJitLinkComplete"));
        cubin_size = reinterpret_cast<decltype(cubin_size)>(dlsym(lib, "nvJitLinkGetLinkedCubinSize"));
        error_log_size = reinterpret_cast<decltype(error_log_size)>(dlsym(lib, "nvJitLinkGetErrorLogSize"));
        error_log = reinterpret_cast<decltype(error_log)>(dlsym(lib, "nvJitLinkGetErrorLog"));
        destroy = reinterpret_cast<decltype(destroy)>(dlsym(lib, "nvJitLinkDestroy"));
    }
    // The library stays loaded (no dlclose): nvJitLink keeps allocations of its own for the life
    // of the process, which LeakSanitizer reports as leaks once the library's globals that hold
    // them are unmapped (test/lsan.supp names the library for the rest).
    bool usable() const {
        return create && add_data && complete && cubin_size && error_log_size && error_log && destroy;
    }
};

// Compiles `source` for nvptx64 with clang (`flags`, not the slice's -Werror set) to bitcode.
std::vector<std::byte> nvptx_bitcode(const fs::path& dir, const std::string& source, const std::string& flags = "") {
    write_file(dir / "k.c", source);
    REQUIRE(run(std::string("'") + BITSHIP_KERNEL_CLANG_FOR_TEST +
                "' --target=nvptx64-nvidia-cuda -O2 -emit-llvm -c -ffreestanding -I'" BITSHIP_INCLUDE_DIR_FOR_TEST "' " +
                flags + " '" + (dir / "k.c").string() + "' -o '" + (dir / "k.bc").string() + "'") == 0);
    std::ifstream in(dir / "k.bc", std::ios::binary);
    std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::byte> out(chars.size());
    std::memcpy(out.data(), chars.data(), chars.size());
    return out;
}

constexpr int kNvJitLinkInputPtx = 2; // NVJITLINK_INPUT_PTX

} // namespace

TEST_CASE("ptx: the nvptx64 slice of the sample GPU kernels is in their bundle, with both entries", "[unit]") {
    auto view = BundleView::parse(gpu_test_kernels::bundle());
    REQUIRE(view);
    CHECK(view->find_slice("x86_64-unknown-linux-gnu"));
    auto index = view->find_slice("nvptx64-nvidia-cuda");
    REQUIRE(index);
    CHECK(view->slices[*index].triple == "nvptx64-nvidia-cuda");
    CHECK(std::string(gpu_test_kernels::gpu_reduce_u64.entry) == "gpu_reduce_u64");
    CHECK(std::string(gpu_test_kernels::gpu_exp_f32.entry) == "gpu_exp_f32");
}

TEST_CASE("ptx: compile_to_ptx makes .entry kernels with libdevice linked and NVVMReflect folded", "[unit]") {
    if (jit::find_libdevice().empty()) {
        WARN("skipped: no libdevice.10.bc (CUDA Toolkit not installed; set CUDA_HOME)");
        return;
    }
    std::string ptx = ptx_for(90);
    CHECK(ptx.find(".target sm_90") != std::string::npos);
    CHECK(ptx.find(".visible .entry gpu_reduce_u64(") != std::string::npos);
    CHECK(ptx.find(".visible .entry gpu_exp_f32(") != std::string::npos);
    CHECK(ptx.find(".func gpu_reduce_u64") == std::string::npos);
    CHECK(ptx.find(".func gpu_exp_f32") == std::string::npos);
    CHECK(ptx.find("__nvvm_reflect") == std::string::npos);
    CHECK(ptx.find("__nv_") == std::string::npos); // expf inlined from libdevice, nothing left to call
    CHECK(ptx.find("atom.global.add.u64") != std::string::npos);
    CHECK(ptx.find("ex2.approx") != std::string::npos); // libdevice's expf body
    // LLVM's default PTX version for sm_90, not the +ptxNN the client's clang wrote.
    CHECK(ptx.find(".version 7.8") != std::string::npos);
}

TEST_CASE("ptx: compile_to_ptx caps the GPU architecture at sm_90", "[unit]") {
    if (jit::find_libdevice().empty()) {
        WARN("skipped: no libdevice.10.bc (CUDA Toolkit not installed; set CUDA_HOME)");
        return;
    }
    CHECK(ptx_for(100).find(".target sm_90") != std::string::npos);
    CHECK(ptx_for(80).find(".target sm_80") != std::string::npos);
}

TEST_CASE("ptx: compile_to_ptx refuses what is not nvptx64 bitcode, and libdevice calls without libdevice", "[unit]") {
    std::vector<std::byte> junk(64, std::byte{0x42});
    auto bad = jit::compile_to_ptx(junk, 90, jit::find_libdevice());
    REQUIRE_FALSE(bad);
    CHECK(bad.error().code == Errc::invalid_bitcode);

    auto view = BundleView::parse(gpu_test_kernels::bundle());
    REQUIRE(view);
    auto x86 = view->find_slice("x86_64-unknown-linux-gnu");
    REQUIRE(x86);
    auto cpu = jit::compile_to_ptx(view->slices[*x86].bitcode, 90, jit::find_libdevice());
    REQUIRE_FALSE(cpu);
    CHECK(cpu.error().code == Errc::invalid_bitcode);
    CHECK(cpu.error().message.find("x86_64") != std::string::npos);

    auto no_lib = jit::compile_to_ptx(nvptx_slice(), 90, fs::path{});
    REQUIRE_FALSE(no_lib);
    CHECK(no_lib.error().code == Errc::no_device);
    CHECK(no_lib.error().message.find("libdevice") != std::string::npos);
    auto no_bytes = jit::compile_to_ptx(nvptx_slice(), 90, std::span<const std::byte>{});
    REQUIRE_FALSE(no_bytes);
    CHECK(no_bytes.error().code == Errc::no_device);

    auto unreadable = jit::compile_to_ptx(nvptx_slice(), 90, fs::path("/nonexistent/libdevice.10.bc"));
    REQUIRE_FALSE(unreadable);
    CHECK(unreadable.error().code == Errc::no_device);
    CHECK(unreadable.error().message.find("/nonexistent/libdevice.10.bc") != std::string::npos);
}

TEST_CASE("ptx: ptxas accepts the PTX for sm_90, of the sample kernels and of test/gpu's", "[unit]") {
    fs::path ptxas = cuda_home() / "bin/ptxas";
    if (!fs::exists(ptxas) || jit::find_libdevice().empty()) {
        WARN("skipped: no " << ptxas << " or libdevice (CUDA Toolkit not installed)");
        return;
    }
    for (auto bundle : {gpu_test_kernels::bundle, gpu_ops_kernels::bundle}) {
        TempDir dir;
        auto ptx = ptx_for(90, bundle);
        write_file(dir.path / "k.ptx", ptx);
        CHECK(run("'" + ptxas.string() + "' -arch=sm_90 '" + (dir.path / "k.ptx").string() + "' -o '" +
                  (dir.path / "k.cubin").string() + "'") == 0);
        CHECK(fs::file_size(dir.path / "k.cubin") > 0);
        if (bundle == gpu_ops_kernels::bundle) {
            for (const char* entry : {"fill_u64", "sum_u64", "where", "where_declared", "sees_data", "fault", "spin_forever"})
                CHECK(ptx.find(std::string(".entry ") + entry) != std::string::npos);
            // A declared geometry stays in the PTX, external, for the agent to read.
            CHECK(ptx.find(".visible .global .align 4 .b8 bs_gpu_geometry_where_declared[8] = {128, 0, 0, 0, 2};") !=
                  std::string::npos);
        }
    }
}

TEST_CASE("ptx: nvJitLink makes an sm_90 cubin of the PTX", "[unit]") {
    fs::path so = cuda_home() / "lib64/libnvJitLink.so";
    NvJitLink link(so);
    if (!link.lib || jit::find_libdevice().empty()) {
        WARN("skipped: cannot load " << so << " or no libdevice (CUDA Toolkit not installed): " << dlerror());
        return;
    }
    REQUIRE(link.usable());
    std::string ptx = ptx_for(90);
    NvJitLink::Handle handle = nullptr;
    const char* options[] = {"-arch=sm_90"};
    REQUIRE(link.create(&handle, 1, options) == 0);
    CHECK(link.add_data(handle, kNvJitLinkInputPtx, ptx.c_str(), ptx.size() + 1, "gpu_test_kernels") == 0);
    int completed = link.complete(handle);
    if (completed != 0) {
        std::size_t n = 0;
        link.error_log_size(handle, &n);
        std::string log(n, '\0');
        if (n) link.error_log(handle, log.data());
        FAIL("nvJitLinkComplete: " << completed << ": " << log);
    }
    std::size_t size = 0;
    CHECK(link.cubin_size(handle, &size) == 0);
    CHECK(size > 0);
    link.destroy(&handle);
}

TEST_CASE("ptx: a GPU kernel without its kernel attribute does not build", "[unit]") {
    TempDir dir;
    const std::string compile = std::string("'") + BITSHIP_KERNEL_CLANG_FOR_TEST +
                                "' --target=nvptx64-nvidia-cuda -O2 -emit-llvm -c " BITSHIP_NVPTX_FLAGS_FOR_TEST
                                " -I'" BITSHIP_INCLUDE_DIR_FOR_TEST "' ";
    auto build = [&](const std::string& name, const std::string& source) {
        write_file(dir.path / (name + ".c"), source);
        return run(compile + "'" + (dir.path / (name + ".c")).string() + "' -o '" +
                   (dir.path / (name + ".bc")).string() + "' 2>/dev/null");
    };
    // The same kernel through BS_GPU_KERNEL builds: the failures below are the attribute's.
    CHECK(build("good", "#include <bitship/gpu_kernel.h>\n"
                        "BS_GPU_KERNEL(k) { *(int*)result = 1; }\n") == 0);
    // Attribute removed: a plain definition (would be a silent .func).
    CHECK(build("plain", "#include <bitship/gpu_kernel.h>\n"
                         "void k(const void* args, void* result, void* const* regions) { *(int*)result = 1; }\n") != 0);
    // Attribute ignored (on something it cannot apply to) or misspelt.
    CHECK(build("ignored", "#include <bitship/gpu_kernel.h>\n"
                           "__attribute__((nvptx_kernel)) int not_a_function;\n"
                           "BS_GPU_KERNEL(k) { *(int*)result = not_a_function; }\n") != 0);
    CHECK(build("misspelt", "__attribute__((nvptx_kernal)) void k(void* result);\n"
                            "__attribute__((nvptx_kernal)) void k(void* result) { *(int*)result = 1; }\n") != 0);
}

TEST_CASE("ptx: compile_to_ptx names an external function that is not a kernel, and a call nothing provides", "[unit]") {
    TempDir dir;
    // Built without the slice's -Werror flags, as a client with another build could.
    auto plain = nvptx_bitcode(dir.path, "void lost(void* result) { *(int*)result = 1; }\n"
                                         "__attribute__((nvptx_kernel)) void k(void* result) { lost(result); }\n");
    auto lost = jit::compile_to_ptx(plain, 90, jit::find_libdevice());
    REQUIRE_FALSE(lost);
    CHECK(lost.error().code == Errc::compile_failed);
    CHECK(lost.error().message.find("lost") != std::string::npos);

    auto libm = nvptx_bitcode(dir.path, "float expf(float);\n"
                                        "__attribute__((nvptx_kernel)) void k(float* x) { *x = expf(*x); }\n");
    auto unresolved = jit::compile_to_ptx(libm, 90, jit::find_libdevice());
    REQUIRE_FALSE(unresolved);
    CHECK(unresolved.error().code == Errc::compile_failed);
    CHECK(unresolved.error().message.find("expf") != std::string::npos);

    auto none = nvptx_bitcode(dir.path, "static int unused;\n");
    auto no_kernel = jit::compile_to_ptx(none, 90, jit::find_libdevice());
    REQUIRE_FALSE(no_kernel);
    CHECK(no_kernel.error().code == Errc::compile_failed);
    CHECK(no_kernel.error().message.find("no kernel") != std::string::npos);
}

TEST_CASE("ptx: bs_gpu_printf becomes the device's vprintf, which ptxas accepts", "[unit]") {
    fs::path ptxas = cuda_home() / "bin/ptxas";
    if (!fs::exists(ptxas)) {
        WARN("skipped: no " << ptxas << " (CUDA Toolkit not installed)");
        return;
    }
    TempDir dir;
    auto bc = nvptx_bitcode(dir.path, "#include <bitship/gpu_kernel.h>\n"
                                      "BS_GPU_KERNEL(hello) { bs_gpu_printf(\"thread %u of %u\\n\", "
                                      "bs_gpu_thread_x(), bs_gpu_block_dim_x()); }\n",
                            BITSHIP_NVPTX_FLAGS_FOR_TEST);
    auto ptx = jit::compile_to_ptx(bc, 90, jit::find_libdevice());
    if (!ptx) FAIL(ptx.error().describe());
    CHECK(ptx->find("call.uni") != std::string::npos);
    CHECK(ptx->find("vprintf") != std::string::npos);
    write_file(dir.path / "p.ptx", *ptx);
    CHECK(run("'" + ptxas.string() + "' -arch=sm_90 '" + (dir.path / "p.ptx").string() + "' -o /dev/null") == 0);
}

}  // namespace ptx_test_cpp
