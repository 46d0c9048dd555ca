#pragma once
// The floor every call is measured against: bare UCX, as `ucx_perftest` (ucx-utils) measures
// it, run by the benchmark itself in the same run, on the same transports and with the same
// loopback pinning as bitship's engine. Nothing here goes through bitship's own code.

#include <optional>
#include <string>

#include <bitship/transport.hpp>

namespace bitship::bench {

/// One ucx_perftest result: its final line.
struct PerftestResult {
    std::string test;       ///< e.g. "ucp_am_lat"
    std::size_t size = 0;   ///< message size in bytes
    double latency_us = 0;  ///< one-way latency, median (latency tests)
    double bandwidth_mib_s = 0; ///< overall bandwidth, MiB/s
    double message_rate = 0;    ///< overall messages per second
    std::string command;    ///< what ran, for the printed configuration
};

/// The UCX_TLS value the engine uses for `transport` (shared memory still needs TCP for the
/// sockaddr handshake; the data lanes are shared memory).
std::string ucx_tls_for(Transport transport);

/// Runs `ucx_perftest` as a server and a client on 127.0.0.1 (UCX_NET_DEVICES=lo unless set):
/// `test` is ucp_am_lat or ucp_am_bw, `size` the message bytes. nullopt (with a line on
/// stderr saying why) when ucx_perftest is missing or fails. `error_handling` (ucx_perftest -e)
/// makes its endpoints as bitship's engine makes its own, with peer error handling, and over
/// shared memory with UCX_MM_ERROR_HANDLING=y as the engine sets it: without that, UCX 1.13
/// silently moves such endpoints to TCP, and `-e` measured TCP's rate (4.2 GB/s for 16 MiB
/// messages here, against 13.3 with it).
std::optional<PerftestResult> run_perftest(Transport transport, const std::string& test, std::size_t size,
                                           std::size_t iterations, std::size_t warmup, bool error_handling = false);

} // namespace bitship::bench
