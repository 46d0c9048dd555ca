#include "emulated_agent.hpp"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace bitship::launch {
namespace {

constexpr const char* kBinfmtDir = "/proc/sys/fs/binfmt_misc";
// What binfmt_misc matches aarch64 ELF executables by (e_ident, e_type, e_machine = 183), as
// qemu-user-static registers it.
constexpr const char* kAarch64Magic = "magic 7f454c460201010000000000000000000200b700";
// An emulated agent compiles its first kernels and the JIT warm-up several times slower.
constexpr auto kEmulatedStartTimeout = std::chrono::seconds(120);

std::string read_file(const std::filesystem::path& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

// The name of an enabled binfmt_misc entry for aarch64 ELF binaries, or why there is none.
std::optional<std::string> binfmt_problem() {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::exists(fs::path(kBinfmtDir) / "status", ec))
        return std::string("binfmt_misc is not mounted at ") + kBinfmtDir +
               " (scripts/setup.sh --with-aarch64 mounts it; a container may not allow it)";
    if (read_file(fs::path(kBinfmtDir) / "status").rfind("enabled", 0) != 0)
        return std::string("binfmt_misc is disabled (") + kBinfmtDir + "/status)";
    for (const auto& entry : fs::directory_iterator(kBinfmtDir, ec)) {
        auto name = entry.path().filename().string();
        if (name == "status" || name == "register") continue;
        auto text = read_file(entry.path());
        if (text.rfind("enabled", 0) == 0 && text.find(kAarch64Magic) != std::string::npos) return std::nullopt;
    }
    return std::string("no enabled binfmt_misc entry runs aarch64 binaries (install qemu-user-static and "
                       "binfmt-support, then update-binfmts --enable qemu-aarch64: scripts/setup.sh --with-aarch64)");
}

} // namespace

std::string aarch64_agent_path() {
    if (const char* env = std::getenv("BITSHIP_AARCH64_XAGENT"); env && *env) return env;
    return BITSHIP_AARCH64_XAGENT;
}

EmulatedAgent find_aarch64_agent(const std::string& cpu) {
    EmulatedAgent out;
    auto path = aarch64_agent_path();
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) {
        out.why_not = "no aarch64 xagent at " + path +
                      " (build it: scripts/setup.sh --with-aarch64 && cmake --preset aarch64 && cmake --build --preset "
                      "aarch64; or set BITSHIP_AARCH64_XAGENT)";
        return out;
    }
    if (auto problem = binfmt_problem()) {
        out.why_not = *problem;
        return out;
    }
    // No QEMU_LD_PREFIX: the aarch64 loader and libc are the multiarch ones (libc6:arm64) at
    // their usual paths; pointing qemu at the cross libc instead makes pthread_create hang.
    out.program = AgentProgram{path, {"QEMU_CPU=" + cpu, "QEMU_LD_PREFIX"}, kEmulatedStartTimeout};
    return out;
}

} // namespace bitship::launch
