#include "bulk_windows.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace bitship::agent {

Result<std::span<std::byte>> BulkWindow::at(std::uint64_t offset, std::uint64_t size) const {
    if (offset > this->size() || size > this->size() - offset)
        return fail(Errc::out_of_bounds,
                    fmt::format("{} bytes at offset {} lie outside the session's bulk window of {} bytes", size, offset, this->size()));
    return std::span<std::byte>(base() + offset, size);
}

BulkWindows::~BulkWindows() { clear(); }

Result<std::shared_ptr<BulkWindow>> BulkWindows::open(std::uint64_t conn) {
    if (auto it = by_conn_.find(conn); it != by_conn_.end()) return it->second;
    if (window_bytes_ == 0)
        return fail(Errc::invalid_argument, "this agent gives no bulk windows (xagent --bulk-window-mib 0, or --transport tcp)");
    sweep();
    if (by_conn_.size() + closed_.size() >= max_windows_)
        return fail(Errc::too_large, fmt::format("the agent's {} bulk windows are all in use", max_windows_));
    // Not touched here: faulting in 16 MiB of 4 KiB pages took some 50 ms on a VM, and the
    // session's first call waited behind it. A slot's pages come in with its first use.
    auto mapped = engine_.map_memory(window_bytes_, Engine::RegionMemory::shared, nullptr, Engine::Touch::on_use);
    if (!mapped) return fail(mapped.error().code, fmt::format("a bulk window: {}", mapped.error().message));
    auto w = std::make_shared<BulkWindow>();
    w->memory = std::move(*mapped);
    by_conn_.emplace(conn, w);
    spdlog::debug("connection {}: bulk window of {} bytes at {} ({})", conn, w->size(), w->memory.base, w->memory.pages);
    return w;
}

std::shared_ptr<BulkWindow> BulkWindows::find(std::uint64_t conn) const {
    auto it = by_conn_.find(conn);
    return it == by_conn_.end() ? nullptr : it->second;
}

void BulkWindows::close(std::uint64_t conn) {
    auto node = by_conn_.extract(conn);
    if (!node.empty()) closed_.push_back(std::move(node.mapped()));
    sweep();
}

void BulkWindows::sweep() {
    std::erase_if(closed_, [&](std::shared_ptr<BulkWindow>& w) {
        if (w.use_count() > 1) return false;
        engine_.unmap_memory(w->memory);
        return true;
    });
}

void BulkWindows::clear() {
    for (auto& [conn, w] : by_conn_) closed_.push_back(std::move(w));
    by_conn_.clear();
    for (auto& w : closed_) engine_.unmap_memory(w->memory);
    closed_.clear();
}

} // namespace bitship::agent
