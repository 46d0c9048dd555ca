#pragma once
// The arguments of `mix` (bench/kernels/compute.c, the jit_tiers_kernels bundle) and what it
// answers, worked out here to check every answer. Used by jit_tiers and ship_latency.

#include <array>
#include <cstddef>
#include <cstdint>

namespace bitship::bench {

struct MixArgs {
    std::uint64_t seed, rounds;
    std::array<std::uint64_t, 16> table;
};

inline MixArgs mix_args(std::uint64_t rounds) {
    MixArgs a{12345, rounds, {}};
    for (std::size_t i = 0; i < a.table.size(); ++i) a.table[i] = i * 0x9E3779B97F4A7C15ull;
    return a;
}

/// What the kernel answers for `in`.
inline std::uint64_t mix_expected(const MixArgs& in) {
    auto table = in.table;
    std::uint64_t x = in.seed, sum = 0;
    for (std::uint64_t r = 0; r < in.rounds; ++r) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        std::uint64_t v = (x >> 29) ^ table[(x >> 60) & 15];
        table[r & 15] += v;
        sum += v * (r | 1);
    }
    return sum;
}

} // namespace bitship::bench
