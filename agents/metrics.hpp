#pragma once
// `xagent --metrics HOST:PORT`: the agent's counters, per-kernel and per-client statistics in
// Prometheus text format (version 0.0.4) at GET /metrics, served by cpp-httplib on its own
// threads (never the agent's progress or worker threads).
//
//   auto server = MetricsServer::start("127.0.0.1", 9464, [&] { return render_prometheus(agent); });
//   ...                                 // scraped while the agent runs
//   server.reset();                     // stops serving, joins its thread

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <bitship/errc.hpp>

namespace bitship::agent {

class Agent;

/// The Prometheus exposition of `agent`: bitship_agent_* counters, bitship_kernel_* per
/// (hash, entry), bitship_client_* per client identity, and bitship_agent_info.
std::string render_prometheus(const Agent& agent);

/// Escapes a label value for the text format (backslash, double quote, newline).
std::string prometheus_label(std::string_view value);

class MetricsServer {
public:
    /// Binds HOST:PORT (port 0: a free one) before returning, so a bad address fails here.
    static Result<std::unique_ptr<MetricsServer>> start(const std::string& host, std::uint16_t port,
                                                        std::function<std::string()> render);
    ~MetricsServer();
    MetricsServer(const MetricsServer&) = delete;
    MetricsServer& operator=(const MetricsServer&) = delete;
    [[nodiscard]] std::uint16_t port() const noexcept { return port_; }

    struct Impl;

private:
    explicit MetricsServer(std::unique_ptr<Impl> impl, std::uint16_t port);
    std::unique_ptr<Impl> impl_;
    std::uint16_t port_ = 0;
};

} // namespace bitship::agent
