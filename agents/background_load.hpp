#pragma once
// A second client that keeps agents busy, for tests and benchmarks that need a loaded agent: a
// kernel running and more queued behind it. `per_agent` calls of `burn` stay in flight to each
// agent (as one finishes the next is sent) until the load is destroyed.
//
//   BackgroundLoad load(options, {agent.address()}, 2,
//                       [](Client& c, const Target& t) { return c.ship(kernels::busy_count, t, ns); });
//   load.wait_for_calls(2, 5s);   // the load is on
//
// Not part of the product: it lives beside the launcher that starts the agents it loads.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <bitship/client.hpp>

namespace bitship::launch {

class BackgroundLoad {
public:
    using Burn = std::function<Future(Client& client, const Target& target)>;
    /// Connects its own client to every address (one it cannot reach is left out: then
    /// calls() stays short of what a caller waits for) and starts sending.
    BackgroundLoad(ClientOptions options, std::vector<std::string> addresses, unsigned per_agent, Burn burn);
    /// Stops sending and waits for the calls in flight.
    ~BackgroundLoad();
    BackgroundLoad(const BackgroundLoad&) = delete;
    BackgroundLoad& operator=(const BackgroundLoad&) = delete;

    /// Calls that finished with an answer (errors are not counted).
    [[nodiscard]] std::uint64_t calls() const noexcept { return calls_.load(); }
    /// Waits until `n` calls have finished, or `timeout`; false on timeout.
    bool wait_for_calls(std::uint64_t n, std::chrono::milliseconds timeout) const;

private:
    std::atomic<bool> stop_{false};
    std::atomic<std::uint64_t> calls_{0};
    std::thread thread_;
};

} // namespace bitship::launch
