#pragma once
// The aarch64 xagent (the cross build, preset aarch64) as tests and benchmarks on an x86-64
// machine start it: run by qemu-user through the kernel's binfmt_misc table, with QEMU_CPU
// naming the emulated CPU. Not a DPU: qemu runs LLVM and kernels several times slower.
//
//   auto arm = launch::find_aarch64_agent("neoverse-n1");
//   if (!arm.program) skip(arm.why_not);
//   launch::AgentProcess agent(*arm.program, "tcp");

#include <optional>
#include <string>

#include "launcher.hpp"

namespace bitship::launch {

/// The aarch64 xagent's path: $BITSHIP_AARCH64_XAGENT, else the build-time default
/// (CMake cache variable BITSHIP_AARCH64_XAGENT: build-aarch64/agents/xagent).
std::string aarch64_agent_path();

struct EmulatedAgent {
    std::optional<AgentProgram> program; ///< set when the agent exists and can run here
    std::string why_not;                 ///< otherwise: what is missing, and what to run
};

/// The aarch64 xagent ready to start, with QEMU_CPU=`cpu` in its environment, or why it cannot
/// run on this machine: the binary is missing, or binfmt_misc is not mounted or has no enabled
/// entry for aarch64 ELF binaries. Starts nothing.
EmulatedAgent find_aarch64_agent(const std::string& cpu);

} // namespace bitship::launch
