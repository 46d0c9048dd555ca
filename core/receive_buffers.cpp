#include "receive_buffers.hpp"
#include "spare_bytes.hpp"

#include <utility>

namespace bitship {

std::vector<std::byte> ReceiveBuffers::take(std::size_t size) {
    std::vector<std::byte> out;
    {
        std::lock_guard lock(mutex_);
        // Best: already `size` bytes or more (nothing to fill), then the least capacity.
        auto rank = [size](const std::vector<std::byte>& b) { return std::pair(b.size() < size, b.capacity()); };
        auto best = kept_.end();
        for (auto it = kept_.begin(); it != kept_.end(); ++it)
            if (it->capacity() >= size && (best == kept_.end() || rank(*it) < rank(*best))) best = it;
        if (best != kept_.end()) {
            kept_bytes_ -= best->capacity();
            out = std::move(*best);
            if (best + 1 != kept_.end()) *best = std::move(kept_.back());
            kept_.pop_back();
            ++reused_;
        }
    }
    out.resize(size); // (a new buffer, or one grown past its size: only the new part is filled)
    return out;
}

void ReceiveBuffers::give_back(std::vector<std::byte>&& buffer) noexcept {
    const std::size_t bytes = buffer.capacity();
    if (bytes < kMinKept) {
        SpareBytes::give(std::move(buffer)); // an eager message's: this thread's next message's
        return;
    }
    std::vector<std::byte> gone; // freed outside the lock when it is not kept
    std::lock_guard lock(mutex_);
    if (kept_.size() >= kMaxKept || kept_bytes_ + bytes > max_kept_bytes_) {
        gone = std::move(buffer);
        return;
    }
    try {
        kept_.push_back(std::move(buffer));
        kept_bytes_ += bytes;
    } catch (...) { // (no room to remember it: it is freed)
    }
}

std::size_t ReceiveBuffers::kept_count() const {
    std::lock_guard lock(mutex_);
    return kept_.size();
}

std::uint64_t ReceiveBuffers::reused() const {
    std::lock_guard lock(mutex_);
    return reused_;
}

} // namespace bitship
