#pragma once
// Entries by request id, for the client's calls in flight: ids are handed out in order and
// most calls end soon after they begin, so entry id lives in slot id % kSlots of a ring, and
// only an id whose slot a still-live older call holds goes to an overflow map. Insert, find and
// erase are then an index and a compare (an unordered_map's hash, bucket walk and node cost
// about 400 instructions a call, scripts/call_instructions.sh). Not thread-safe (the client's
// table lives under its progress token). Private to core.
//
// The subset of std::unordered_map the client uses: operator[], find, contains, erase (by key
// or iterator, returning the next), begin/end (ring slots in order, then the overflow), clear.
// As with unordered_map, an insert may invalidate iterators into the overflow (a rehash);
// iterators into the ring stay valid until their entry is erased.

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <utility>

namespace bitship {

template <class Value> class IdTable {
public:
    /// What an iterator reads: the id (not to be changed) and its value.
    using Entry = std::pair<std::uint64_t, Value>;

private:
    using Overflow = std::unordered_map<std::uint64_t, Entry>; ///< by id, the same entry

public:
    /// Ring slots: calls in flight at once beyond this (or an id left far behind) overflow.
    static constexpr std::size_t kSlots = 1024;
    /// Id 0 marks a free slot; an entry with id 0 lives in the overflow.
    static constexpr std::uint64_t kFree = 0;

    IdTable() : ring_(std::make_unique<Entry[]>(kSlots)) {}

    class iterator {
    public:
        Entry& operator*() const { return slot_ < kSlots ? table_->ring_[slot_] : over_->second; }
        Entry* operator->() const { return &**this; }
        iterator& operator++() {
            if (slot_ < kSlots) {
                slot_ = table_->next_used(slot_ + 1);
                if (slot_ == kSlots) over_ = table_->overflow_.begin();
            } else {
                ++over_;
            }
            return *this;
        }
        bool operator==(const iterator& o) const { return slot_ == o.slot_ && (slot_ < kSlots || over_ == o.over_); }

    private:
        friend class IdTable;
        iterator(IdTable* t, std::size_t slot, typename Overflow::iterator over) : table_(t), slot_(slot), over_(over) {}
        IdTable* table_;
        std::size_t slot_; ///< kSlots: in the overflow, at over_
        typename Overflow::iterator over_;
    };

    /// The entry for `id`, made (empty) if missing.
    Value& operator[](std::uint64_t id) {
        auto& s = ring_[id % kSlots];
        if (s.first == id && id != kFree) return s.second;
        if (s.first == kFree && id != kFree) {
            s.first = id;
            used_[(id % kSlots) / 64] |= std::uint64_t{1} << (id % 64);
            return s.second;
        }
        auto& e = overflow_[id];
        e.first = id;
        return e.second;
    }
    [[nodiscard]] iterator find(std::uint64_t id) {
        const std::size_t i = id % kSlots;
        if (ring_[i].first == id && id != kFree) return iterator(this, i, {});
        if (overflow_.empty()) return end();
        auto it = overflow_.find(id);
        return it == overflow_.end() ? end() : iterator(this, kSlots, it);
    }
    [[nodiscard]] bool contains(std::uint64_t id) { return find(id) != end(); }
    [[nodiscard]] iterator begin() {
        const auto first = next_used(0);
        return iterator(this, first, first == kSlots ? overflow_.begin() : typename Overflow::iterator{});
    }
    [[nodiscard]] iterator end() { return iterator(this, kSlots, overflow_.end()); }

    /// Erases the entry at `it`; returns the one after it.
    iterator erase(iterator it) {
        if (it.slot_ < kSlots) {
            auto next = it;
            ++next;
            free_slot(ring_[it.slot_]);
            return next;
        }
        return iterator(this, kSlots, overflow_.erase(it.over_));
    }
    /// Erases `id`'s entry; returns how many were erased (0 or 1).
    std::size_t erase(std::uint64_t id) {
        auto& s = ring_[id % kSlots];
        if (s.first == id && id != kFree) {
            free_slot(s);
            return 1;
        }
        return overflow_.empty() ? 0 : overflow_.erase(id);
    }
    void clear() {
        for (auto i = next_used(0); i < kSlots; i = next_used(i + 1)) free_slot(ring_[i]);
        overflow_.clear();
    }

private:
    void free_slot(Entry& s) {
        const auto i = static_cast<std::size_t>(&s - ring_.get());
        used_[i / 64] &= ~(std::uint64_t{1} << (i % 64));
        s.first = kFree;
        s.second = Value{}; // what it held goes now, as with erase
    }
    // The first used slot at or after `from` (kSlots: none): a scan of kSlots / 64 words at most.
    std::size_t next_used(std::size_t from) const {
        for (std::size_t w = from / 64; w < kWords; ++w) {
            auto bits = used_[w];
            if (w == from / 64) bits &= ~std::uint64_t{0} << (from % 64);
            if (bits != 0) return w * 64 + static_cast<std::size_t>(std::countr_zero(bits));
        }
        return kSlots;
    }

    static constexpr std::size_t kWords = kSlots / 64;
    static_assert(kSlots % 64 == 0);
    std::unique_ptr<Entry[]> ring_; ///< first == kFree: a free slot
    std::array<std::uint64_t, kWords> used_{}; ///< bit i: slot i holds an entry
    Overflow overflow_;
};

} // namespace bitship
