// host(): what this machine is, as LLVM sees it. Detected once; the answer never changes while
// the process runs.
#include "jit.hpp"

#include <llvm/ADT/StringMap.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/TargetParser/Host.h>

#include <algorithm>
#include <vector>

#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>

#include <fmt/format.h>
#endif

namespace bitship::jit {
namespace {

/// "+avx2,+fma,-avx512f,...", sorted so the string is stable from run to run (StringMap
/// iteration order is not).
std::string feature_string() {
    std::vector<std::string> features;
    for (const auto& f : llvm::sys::getHostCPUFeatures())
        features.push_back((f.getValue() ? "+" : "-") + f.getKey().str());
    std::sort(features.begin(), features.end());
    std::string out;
    for (const auto& f : features) out += (out.empty() ? "" : ",") + f;
    return out;
}

#if defined(__aarch64__) && defined(__linux__)
// LLVM names an Arm CPU from /proc/cpuinfo. Under qemu-user (how the tests run aarch64 agents
// on x86-64) that file is the build machine's and says nothing about the emulated CPU, so LLVM
// answers "generic". The CPU's own MIDR_EL1 (implementer, part) is readable from user space when
// the kernel, or qemu, emulates ID-register reads (HWCAP_CPUID); LLVM's parser takes it in
// /proc/cpuinfo's words. On real Arm machines /proc/cpuinfo names the CPU and this is not used.
std::string cpu_from_midr() {
    if ((getauxval(AT_HWCAP) & HWCAP_CPUID) == 0) return "generic";
    std::uint64_t midr = 0;
    asm volatile("mrs %0, MIDR_EL1" : "=r"(midr));
    constexpr unsigned kImplementerShift = 24, kPartShift = 4;
    auto text = fmt::format("CPU implementer\t: {:#x}\nCPU part\t: {:#05x}\n", (midr >> kImplementerShift) & 0xff,
                            (midr >> kPartShift) & 0xfff);
    return llvm::sys::detail::getHostCPUNameForARM(text).str();
}
#endif

std::string cpu_name() {
    std::string cpu = llvm::sys::getHostCPUName().str();
#if defined(__aarch64__) && defined(__linux__)
    if (cpu == "generic") cpu = cpu_from_midr();
#endif
    return cpu;
}

HostInfo detect() {
    HostInfo info;
    info.triple = llvm::sys::getProcessTriple();
    info.cpu = cpu_name();
    info.features = feature_string();
    info.llvm = {LLVM_VERSION_MAJOR, LLVM_VERSION_MINOR, LLVM_VERSION_PATCH};
    return info;
}

} // namespace

const HostInfo& host() {
    static const HostInfo info = detect(); // thread-safe initialisation (C++11 magic statics)
    return info;
}

} // namespace bitship::jit
