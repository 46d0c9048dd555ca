#include "background_load.hpp"

#include <deque>
#include <utility>

namespace bitship::launch {

BackgroundLoad::BackgroundLoad(ClientOptions options, std::vector<std::string> addresses, unsigned per_agent, Burn burn) {
    thread_ = std::thread([this, options, addresses = std::move(addresses), per_agent, burn = std::move(burn)] {
        auto client = Client::create(options);
        if (!client) return;
        std::vector<Target> targets;
        for (const auto& a : addresses)
            if (auto t = client->connect(a)) targets.push_back(*t);
        std::deque<std::pair<std::size_t, Future>> inflight;
        for (std::size_t a = 0; a < targets.size(); ++a)
            for (unsigned i = 0; i < per_agent; ++i) inflight.emplace_back(a, burn(*client, targets[a]));
        while (!stop_.load(std::memory_order_relaxed) && !inflight.empty()) {
            auto [a, f] = std::move(inflight.front());
            inflight.pop_front();
            if (f.get()) calls_.fetch_add(1);
            inflight.emplace_back(a, burn(*client, targets[a]));
        }
        for (auto& [a, f] : inflight) (void)f.get();
    });
}

BackgroundLoad::~BackgroundLoad() {
    stop_ = true;
    thread_.join();
}

bool BackgroundLoad::wait_for_calls(std::uint64_t n, std::chrono::milliseconds timeout) const {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (calls_.load() < n) {
        if (std::chrono::steady_clock::now() > deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
}

} // namespace bitship::launch
