#pragma once
// What bitship signs, byte for byte, so that clients, agents and tests agree:
//
//   session:  "bitship-session-v1\0" · challenge[32] · agent instance (u64 LE) · client key[32]
//   code:     "bitship-code-v1\0"    · slice hash[32]
//
// The tags keep a signature made for one purpose from being accepted for the other. A session
// signature names the challenge of one WELCOME and the agent's instance: replayed to another
// connection (another challenge) or a restarted agent (another instance too), it fails.

#include <array>
#include <cstdint>

#include <bitship/bundle.hpp>
#include <bitship/identity.hpp>

namespace bitship::signing {

/// WELCOME's challenge: fresh random bytes per connection.
using Challenge = std::array<std::uint8_t, 32>;

/// A challenge from the system's CSPRNG.
Challenge fresh_challenge();

/// The client's AUTH signature for this connection.
Signature sign_session(const Identity& who, const Challenge& challenge, std::uint64_t instance);
bool verify_session(const PublicKey& key, const Signature& signature, const Challenge& challenge,
                    std::uint64_t instance) noexcept;

/// An author's signature over a slice's hash.
Signature sign_code(const Identity& author, const CodeHash& hash);
bool verify_code(const PublicKey& key, const Signature& signature, const CodeHash& hash) noexcept;

} // namespace bitship::signing
