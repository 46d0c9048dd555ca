#include "args_landing.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include <fmt/format.h>

#include "page_size.hpp"
#include "sandbox_arena.hpp"

namespace bitship::agent {

struct ArgsLanding::State {
    std::mutex mutex;        // taken
    std::byte* base = nullptr;
    std::size_t slot_bytes = 0;
    std::vector<bool> taken; // by slot
    // Wipes hold it shared, the landing's end exclusively: its memory outlives every wipe, and
    // a wipe (a pass over up to a slot) never holds up take().
    std::shared_mutex life;
    bool alive = true; // false once the landing (and its memory) is gone

    void give_back(std::size_t slot, std::size_t bytes) noexcept {
        {
            std::shared_lock wiping(life);
            if (!alive) return;
            // The next call's kernel, another client's maybe, does not find these arguments.
            std::memset(base + slot * slot_bytes, 0, bytes);
        }
        std::lock_guard lock(mutex);
        taken[slot] = false;
    }
};

ArgsLanding::ArgsLanding(SandboxArena& arena, std::shared_ptr<State> state) : arena_(arena), state_(std::move(state)) {}

Result<std::unique_ptr<ArgsLanding>> ArgsLanding::create(SandboxArena& arena, std::size_t slots, std::size_t slot_bytes) {
    if (slots == 0 || slot_bytes == 0) return fail(Errc::invalid_argument, "an argument landing of no slots or empty slots");
    if (slot_bytes > (std::size_t{1} << 40) / slots)
        return fail(Errc::too_large, fmt::format("an argument landing of {} slots of {} bytes", slots, slot_bytes));
    auto state = std::make_shared<State>();
    state->slot_bytes = round_up(slot_bytes, kPage);
    state->taken.assign(slots, false);
    const std::size_t total = slots * state->slot_bytes;
    auto at = arena.allocate_region(total);
    if (!at) return tl::make_unexpected(at.error());
    if (::mmap(*at, total, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) != *at) {
        int err = errno;
        arena.release_region(*at, total);
        return fail(Errc::too_large, fmt::format("cannot map {} argument landing slots of {} KiB in the sandbox arena: {}",
                                                 slots, state->slot_bytes >> 10, std::strerror(err)));
    }
    state->base = *at;
    return std::unique_ptr<ArgsLanding>(new ArgsLanding(arena, std::move(state)));
}

ArgsLanding::~ArgsLanding() {
    {
        std::unique_lock ending(state_->life); // after any wipe under way
        state_->alive = false;                 // a slot let go from now on is not touched
    }
    arena_.release_region(state_->base, state_->taken.size() * state_->slot_bytes);
}

std::optional<Landing> ArgsLanding::take(std::size_t bytes) {
    auto& s = *state_;
    if (bytes == 0 || bytes > s.slot_bytes) return std::nullopt;
    std::size_t slot = 0;
    {
        std::lock_guard lock(s.mutex);
        while (slot < s.taken.size() && s.taken[slot]) ++slot;
        if (slot == s.taken.size()) return std::nullopt;
        s.taken[slot] = true;
    }
    std::byte* at = s.base + slot * s.slot_bytes;
    std::shared_ptr<void> keep;
    try {
        keep = std::shared_ptr<void>(at, [state = state_, slot, bytes](void*) { state->give_back(slot, bytes); });
    } catch (const std::bad_alloc&) { // (the deleter is called when the control block cannot be had)
        return std::nullopt;
    }
    return Landing{std::span(at, bytes), std::move(keep)};
}

std::size_t ArgsLanding::slots_for(std::size_t kernel_threads, std::size_t slot_bytes) noexcept {
    constexpr std::size_t kMaxBytes = std::size_t{64} << 20;
    return std::min(std::clamp<std::size_t>(kernel_threads, 4, 16), kMaxBytes / std::max<std::size_t>(slot_bytes, 1));
}

std::size_t ArgsLanding::slots() const noexcept { return state_->taken.size(); }
std::size_t ArgsLanding::slot_bytes() const noexcept { return state_->slot_bytes; }

} // namespace bitship::agent
