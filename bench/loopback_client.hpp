#pragma once
// The client most benchmarks start: agents on loopback, one progress mode for client and agents;
// a failure to start or connect ends the benchmark with its reason.

#include <string>

#include <bitship/client.hpp>

namespace bitship::bench {

/// The transport `name` names ("tcp", "shm") and the progress mode `name` names: options the
/// command line's checks passed. Throw std::runtime_error naming the value otherwise.
Transport transport_named(const std::string& name);
ProgressMode progress_named(const std::string& name);

/// A client for agents on loopback over `transport`, progressing in `progress` mode ("spin",
/// "block", "spin-then-block"). Throws std::runtime_error with the reason if it cannot start.
Client loopback_client(Transport transport, const std::string& progress = "spin-then-block");

/// `client` connected to the agent at `address`. Throws std::runtime_error with the reason.
Target connect_or_throw(Client& client, const std::string& address);

} // namespace bitship::bench
