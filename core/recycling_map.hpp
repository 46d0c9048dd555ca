#pragma once
// An unordered_map that keeps the nodes of erased entries for the next insertions: a table
// whose entries come and go once per call (the client's calls in flight) then allocates
// nothing in the steady state. The subset of std::unordered_map the client uses; not
// thread-safe (the client's table lives under its progress token). Private to core.

#include <cstddef>
#include <iterator>
#include <unordered_map>
#include <utility>
#include <vector>

namespace bitship {

template <class Key, class Value> class RecyclingMap {
    using Map = std::unordered_map<Key, Value>;

public:
    using iterator = typename Map::iterator;

    /// The entry for `key`, made (with a recycled node when there is one) if missing.
    Value& operator[](const Key& key) {
        if (auto it = map_.find(key); it != map_.end()) return it->second;
        if (spare_.empty()) return map_[key];
        auto node = std::move(spare_.back());
        spare_.pop_back();
        node.key() = key;
        return map_.insert(std::move(node)).position->second;
    }
    [[nodiscard]] iterator find(const Key& key) { return map_.find(key); }
    [[nodiscard]] bool contains(const Key& key) const { return map_.contains(key); }
    [[nodiscard]] iterator begin() { return map_.begin(); }
    [[nodiscard]] iterator end() { return map_.end(); }

    /// Erases the entry at `it`; returns the one after it.
    iterator erase(iterator it) {
        auto next = std::next(it);
        keep(map_.extract(it));
        return next;
    }
    /// Erases `key`'s entry; returns how many were erased (0 or 1).
    std::size_t erase(const Key& key) {
        auto node = map_.extract(key);
        if (node.empty()) return 0;
        keep(std::move(node));
        return 1;
    }
    void clear() {
        while (!map_.empty()) erase(map_.begin());
    }

    /// Nodes kept at most: the calls a client has had in flight at once, up to this.
    static constexpr std::size_t kMaxSpare = 4096;

private:
    void keep(typename Map::node_type&& node) {
        node.mapped() = Value{}; // what the value held goes now, as with erase
        if (spare_.size() < kMaxSpare) spare_.push_back(std::move(node));
    }

    Map map_;
    std::vector<typename Map::node_type> spare_;
};

} // namespace bitship
