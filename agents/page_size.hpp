// The page size the sandbox's arena and the kernel heap lay memory out by, and rounding to it.
#pragma once

#include <cstddef>

namespace bitship::agent {

inline constexpr std::size_t kPage = 4096;

/// `n` rounded up to a multiple of `to` (> 0).
constexpr std::size_t round_up(std::size_t n, std::size_t to) noexcept { return (n + to - 1) / to * to; }

} // namespace bitship::agent
