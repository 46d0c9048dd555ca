#pragma once
// How the shared-library fake CUDA driver (fake_libcuda.cpp) reads the PTX text it is given: it
// executes none of it, but finds its entries, checks their parameters against the bitship ABI,
// and refuses what is not PTX or targets a newer GPU, as cuModuleLoadDataEx would.

#include <cstddef>
#include <map>
#include <string>
#include <string_view>

namespace bitship::test::fake_ptx {

/// The parameters every bitship GPU kernel takes: args, result, regions (each `.param .u64`).
inline constexpr std::size_t kBitshipParams = 3;

/// `ptx` with its // and /* */ comments taken out (a block comment leaves a space).
std::string without_comments(std::string_view ptx);

/// Whether a parameter list ("(.param .u64 a, .param .u64 b, .param .u64 c)") is the bitship
/// ABI's: kBitshipParams `.param .u64`.
bool bitship_abi(std::string_view params);

/// Every `.entry NAME` of `ptx` (comments taken out), with whether its parameters are the ABI's.
std::map<std::string, bool, std::less<>> entries_of(const std::string& ptx);

/// Why `ptx` is refused by a device of compute capability `device_sm` (90 for 9.0), or empty:
/// no `.version` and `.entry`, or a `.target sm_NN` above the device's.
std::string refusal(const std::string& ptx, unsigned device_sm);

} // namespace bitship::test::fake_ptx
