#pragma once
// The JIT linker's memory in Sandbox::sfi: a JITLinkMemoryManager that places a link graph's
// executable segments in CodeZones::code (outside the arena) and every other one (read-only
// data, writable data, the GOT) in CodeZones::data (inside it, where confined loads and stores
// reach them). Mirrors LLVM's InProcessMemoryManager: pages mapped read-write while the linker
// writes and fixes them up, then each segment mprotected to its final permissions at finalize
// (code R-X, read-only data and the GOT R--, data RW-: never writable and executable at once),
// the finalize actions run, and the pages given back on deallocate. The zones are reserved
// (PROT_NONE) by their owner; pages are taken first-fit, page-granular, and given back by
// mapping PROT_NONE over them (MAP_FIXED), never unmapped: the range stays reserved, so nothing
// else of the process is ever mapped inside the arena. Private to jit/.
//
// Built without RTTI (a subclass of an LLVM type), like engine.cpp.

#include <memory>

#include <llvm/ExecutionEngine/JITLink/JITLinkMemoryManager.h>

#include <bitship/errc.hpp>

#include "jit.hpp"

namespace bitship::jit {

/// A JITLinkMemoryManager over `zones` (both page-aligned, reserved by the caller, and within
/// 2 GiB of each other). invalid_argument when a zone is empty or not page-aligned, or overlaps
/// the zones of a manager still alive (one manager per zones: each maps pages as its own).
Result<std::unique_ptr<llvm::jitlink::JITLinkMemoryManager>> make_arena_memory(const CodeZones& zones);

} // namespace bitship::jit
