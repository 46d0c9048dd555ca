// host(): what this machine is, as LLVM sees it. Detected once; the answer never changes while
// the process runs.
#include "jit.hpp"

#include <llvm/ADT/StringMap.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/TargetParser/Host.h>

#include <algorithm>
#include <vector>

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

HostInfo detect() {
    HostInfo info;
    info.triple = llvm::sys::getProcessTriple();
    info.cpu = llvm::sys::getHostCPUName().str();
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
