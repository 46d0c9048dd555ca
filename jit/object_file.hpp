#pragma once
// The disk cache's object files (`<dir>/<hex64>.obj`): a slice's optimised object code with the
// key it was made under (LLVM version, triple, CPU, features, opt level, sandbox mode), its entry
// names and a
// digest over everything. A restarted agent links the object directly when the key is this
// host's; anything else (another LLVM, another CPU, a torn or tampered file) is refused and the
// slice is compiled again from its bundle. Private to jit/.

#include <cstddef>
#include <string>
#include <span>
#include <vector>

#include <bitship/bundle.hpp>
#include <bitship/errc.hpp>

#include "jit.hpp"

namespace bitship::jit {

/// What object code was made for; an object file is used only when its key equals this host's.
struct ObjectKey {
    std::string llvm;     ///< "19.1.7": any other release generates different code
    std::string triple;
    std::string cpu;
    std::string features;
    unsigned opt_level = 2;
    /// Code made for Sandbox::sfi is confined and refers to the arena's symbols; code made for
    /// none is not: neither is ever loaded by an agent of the other mode.
    Sandbox sandbox = Sandbox::none;

    /// This agent's key at `opt_level` in mode `sandbox`.
    static ObjectKey of_this_host(unsigned opt_level, Sandbox sandbox = Sandbox::none);
    bool operator==(const ObjectKey&) const = default;
};

/// The contents of one object file.
struct ObjectFile {
    ObjectKey key;
    CodeHash hash{};                  ///< the slice it was compiled from
    std::vector<std::string> entries; ///< the entry points the object defines
    std::vector<std::byte> object;    ///< relocatable object code (ELF on Linux)
};

/// The file's bytes: magic, key, hash, entries, object, then a digest of all that.
std::vector<std::byte> encode_object_file(const ObjectFile& file);

/// Parses `bytes`; malformed_bundle naming what is wrong when the magic, a length or the digest
/// does not hold. Does not judge the key: the caller compares it.
Result<ObjectFile> decode_object_file(std::span<const std::byte> bytes);

} // namespace bitship::jit
