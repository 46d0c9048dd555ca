#pragma once
// Work done once per key at a time: a thread that asks for a key another thread is working on
// waits for, and returns, that one's result. What the Jit compiles (a CPU slice by hash, PTX by
// hash and sm) goes through one. Private to jit/.

#include <future>
#include <map>
#include <mutex>
#include <optional>

namespace bitship::jit {

template <class Key, class Value> class SingleFlight {
public:
    /// `done()`'s value when it has one (looked at first, and again under the lock); else the
    /// result of `make()`, run on this thread, or of the `make()` another thread is running for
    /// `key`. `make` must leave its value where `done` finds it before it returns (so no thread
    /// finds neither), and must not throw (it would leave `key` in flight for good).
    template <class Done, class Make> Value run(const Key& key, Done done, Make make) {
        if (std::optional<Value> v = done()) return std::move(*v);
        std::promise<Value> promise;
        {
            std::unique_lock lock(mutex_);
            if (std::optional<Value> v = done()) return std::move(*v); // finished meanwhile
            if (auto it = flights_.find(key); it != flights_.end()) {
                auto pending = it->second;
                lock.unlock();
                return pending.get();
            }
            flights_.emplace(key, promise.get_future().share());
        }
        Value result = make();
        {
            std::lock_guard lock(mutex_);
            flights_.erase(key);
        }
        promise.set_value(result);
        return result;
    }

private:
    std::mutex mutex_;
    std::map<Key, std::shared_future<Value>> flights_;
};

} // namespace bitship::jit
