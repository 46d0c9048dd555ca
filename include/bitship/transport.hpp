#pragma once
/// @file
/// Transport and progress choices shared by clients and agents.

#include <chrono>
#include <string_view>

#include <bitship/errc.hpp>

namespace bitship {

/// Which UCX transports carry the data: TCP only, shared memory (TCP still makes the
/// connection handshake), or whatever UCX picks.
enum class Transport { any, tcp, shm };
Result<Transport> parse_transport(std::string_view name);
std::string_view to_string(Transport t) noexcept;

/// How a progress thread waits for work: poll forever, sleep on the worker's event fd at
/// once, or poll for a while after the last event and then sleep (the default).
enum class ProgressMode { spin, block, spin_then_block };
Result<ProgressMode> parse_progress_mode(std::string_view name);
std::string_view to_string(ProgressMode m) noexcept;

/// How long spin_then_block polls after the last event before it sleeps, by default: clients
/// (ClientOptions::spin) and agents (xagent --spin-us) alike.
inline constexpr std::chrono::microseconds kDefaultSpin{200};

} // namespace bitship
