#pragma once
// Same-host bulk data without UCX's copies: a session's window of shared memory that its
// client maps (ucp_rkey_ptr). The client writes a call's arguments into a slot of it and says
// so in the RUN; the agent writes a large result into the slot the RUN offered and says so in
// the RESULT (bs_reply writes it there: the kernel's bytes are copied once). UCX 1.13 gives
// endpoints with peer error handling no CMA lane (`ucx_info -e -u amwe -P intra` lists none),
// so without this a same-host megabyte travels as 8 KiB copy-in/copy-out fragments. (Bare
// `ucx_perftest -e` moves those at 6.7-14.5 GB/s here, no slower than its CMA copy; what the
// window saves bitship is its own receive buffer and the copies around it.)
//
// The window is the agent's own memory, made on the client's WINDOW request after the session
// is admitted: the agent never maps what a client names. What the client writes there while a
// call runs can only change its own call: arguments are copied out once, before anything reads
// them (into the sandbox's call buffer under sfi, into the request otherwise), and the agent
// reads nothing else from the window. Whoever progresses owns the table.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include <bitship/errc.hpp>

#include "core/engine.hpp"
#include "core/wire.hpp"

namespace bitship::agent {

/// One session's window. Shared by the table (while the session lives) and the RUNs using it
/// (until they are answered), so a session that closes mid-call never unmaps under a call.
struct BulkWindow {
    Engine::Mapped memory;
    [[nodiscard]] std::byte* base() const noexcept { return static_cast<std::byte*>(memory.base); }
    [[nodiscard]] std::size_t size() const noexcept { return memory.size; }
    /// `size` bytes at `offset`, when they lie inside the window (refused: out_of_bounds).
    Result<std::span<std::byte>> at(std::uint64_t offset, std::uint64_t size) const;
};

class BulkWindows {
public:
    /// `window_bytes` per session (0: no windows, WINDOW is refused); at most `max_windows`.
    BulkWindows(Engine& engine, std::size_t window_bytes, std::size_t max_windows)
        : engine_(engine), window_bytes_(window_bytes), max_windows_(max_windows) {}
    ~BulkWindows();
    BulkWindows(const BulkWindows&) = delete;
    BulkWindows& operator=(const BulkWindows&) = delete;

    /// Connection `conn`'s window, made on its first request.
    Result<std::shared_ptr<BulkWindow>> open(std::uint64_t conn);
    /// Its window, or nullptr when it asked for none.
    [[nodiscard]] std::shared_ptr<BulkWindow> find(std::uint64_t conn) const;
    /// The session ended: its window goes once no call holds it.
    void close(std::uint64_t conn);
    /// Unmaps closed windows no call holds any more.
    void sweep();
    /// Unmaps every window (the engine must still be there; calls are over).
    void clear();
    [[nodiscard]] std::size_t open_count() const noexcept { return by_conn_.size(); }

private:
    Engine& engine_;
    std::size_t window_bytes_;
    std::size_t max_windows_;
    std::map<std::uint64_t, std::shared_ptr<BulkWindow>> by_conn_;
    std::vector<std::shared_ptr<BulkWindow>> closed_;
};

} // namespace bitship::agent
