#pragma once
// Landing slots for large call arguments, inside the sandbox arena (xagent --sandbox sfi).
//
// A split RUN (core/wire_split.hpp) carries its arguments apart from its other fields. The
// engine receives them into one of these slots (EngineHooks::land_args), and a sandboxed
// kernel reads them there: otherwise they are received into a receive buffer and copied into
// the thread's call buffer before the kernel runs, a pass over every byte (8% of all samples
// of bench/ship_rate's TCP 1 MiB arguments row). Only the arguments land here; the fields the
// agent checks (hash, code, signatures) stay in its own memory, out of every kernel's reach.
//
// A slot is held by its call (RunRequest::args_home) and wiped when let go, as the call buffer
// is after each call. When every slot is taken, or the arguments are larger than a slot, they
// go the old way.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include <bitship/errc.hpp>

#include "core/engine.hpp"

namespace bitship::agent {

class SandboxArena;

class ArgsLanding {
public:
    /// `slots` slots of `slot_bytes` each (rounded up to whole pages), in a region of `arena`
    /// (which must outlive this).
    static Result<std::unique_ptr<ArgsLanding>> create(SandboxArena& arena, std::size_t slots, std::size_t slot_bytes);
    /// How many slots of `slot_bytes` an agent keeps for `kernel_threads` threads that run
    /// kernels: one each, 4 to 16, and 64 MiB of them at most (0: slots that large don't fit).
    static std::size_t slots_for(std::size_t kernel_threads, std::size_t slot_bytes) noexcept;
    ~ArgsLanding();
    ArgsLanding(const ArgsLanding&) = delete;
    ArgsLanding& operator=(const ArgsLanding&) = delete;

    /// A free slot's first `bytes` bytes, held until the Landing's `keep` is let go (then
    /// wiped); nullopt when none is free or `bytes` exceeds a slot. Any thread; it waits for
    /// nothing but a short lock (a slot's wipe is done outside it).
    std::optional<Landing> take(std::size_t bytes);

    [[nodiscard]] std::size_t slots() const noexcept;
    [[nodiscard]] std::size_t slot_bytes() const noexcept;

private:
    struct State;
    ArgsLanding(SandboxArena& arena, std::shared_ptr<State> state);
    SandboxArena& arena_;
    std::shared_ptr<State> state_; // shared with every held slot's keep
};

} // namespace bitship::agent
