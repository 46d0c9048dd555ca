#include "bulk_window.hpp"

#include <bit>

namespace bitship {

namespace {
constexpr std::size_t kLine = 64;
}

WindowSlots::WindowSlots(std::size_t window_bytes, unsigned count) {
    if (count == 0 || count > 64) return;
    slot_bytes_ = window_bytes / count / kLine * kLine;
    if (slot_bytes_ == 0) return;
    count_ = count;
    free_ = count == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << count) - 1;
}

std::optional<unsigned> WindowSlots::take() noexcept {
    if (free_ == 0) return std::nullopt;
    const auto slot = static_cast<unsigned>(std::countr_zero(free_));
    free_ &= free_ - 1;
    return slot;
}

void WindowSlots::give_back(unsigned slot) noexcept {
    if (slot < count_) free_ |= std::uint64_t{1} << slot;
}

unsigned WindowSlots::free_count() const noexcept { return static_cast<unsigned>(std::popcount(free_)); }

} // namespace bitship
