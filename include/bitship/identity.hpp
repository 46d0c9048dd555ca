#pragma once
/// @file
/// Identities: Ed25519 key pairs that authenticate clients (and agents forwarding to agents) and
/// sign shipped code. Files and text forms follow SSH's habits:
///
/// - a secret key file, mode 0600 (refused when group or others may read it):
///   @code
///     # bitship secret key: keep it private (mode 0600)
///     ed25519-secret <base64 of the 32-byte seed> NAME
///   @endcode
/// - a public key line, as in an agent's authorized keys file: `ed25519 <base64> NAME`;
/// - a fingerprint, as `ssh-keygen -l` prints one: `SHA256:<base64 of SHA-256 of the key, unpadded>`.
///
/// @code
///   auto me = bitship::Identity::generate("alice@laptop").value();
///   me.save("alice.key").value();                     // mode 0600; alice.key.pub beside it
///   auto again = bitship::Identity::load("alice.key"); // refused if chmod 644
///   fmt::print("{}\n", bitship::fingerprint(again->public_key()));
/// @endcode

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <bitship/errc.hpp>

namespace bitship {

/// An Ed25519 public key.
using PublicKey = std::array<std::uint8_t, 32>;
/// An Ed25519 signature.
using Signature = std::array<std::uint8_t, 64>;

/// How an agent admits clients, as its WELCOME says (AgentInfo::access).
enum class AgentAccess : std::uint8_t {
    open = 0,     ///< no keys: anyone who reaches it, and it listens on loopback only
    keys = 1,     ///< clients authenticate with an authorized key; code must be signed by one
    insecure = 2, ///< no keys although it listens beyond loopback (xagent --insecure)
};

/// "open", "keys" or "insecure".
std::string_view to_string(AgentAccess access) noexcept;

/// `"SHA256:…"`: the SHA-256 of the key in unpadded base64, as ssh-keygen prints fingerprints.
std::string fingerprint(const PublicKey& key);

/// `"ed25519 <base64> NAME"` (NAME omitted when empty).
std::string format_public_key(const PublicKey& key, std::string_view name);

/// A public key and the name it goes by.
struct NamedKey {
    PublicKey key{};
    std::string name;
};

/// Reads `"ed25519 <base64> [NAME...]"`; the name is the rest of the line, trimmed.
Result<NamedKey> parse_public_key(std::string_view line);

/// Reads an authorized keys file: one public key line per key, `#` comments and blank lines
/// allowed. A malformed line fails the whole file with an error naming the file and the line
/// number; so does a file that group or others may write.
Result<std::vector<NamedKey>> read_authorized_keys(const std::filesystem::path& file);

/// Whether `signature` is `key`'s over `message`.
bool verify(const PublicKey& key, std::span<const std::byte> message, const Signature& signature) noexcept;

/// An Ed25519 key pair. Move-only; the secret is wiped when it goes.
class Identity {
public:
    /// A fresh key pair named `name` (`"user@host"` when empty).
    static Result<Identity> generate(std::string name = {});
    /// Reads a secret key file. Refused, naming the file and its mode, when group or others
    /// have any permission on it; io_error when it cannot be read; invalid_argument when it is
    /// not a bitship secret key.
    static Result<Identity> load(const std::filesystem::path& file);

    /// Writes the secret key to `file` (created mode 0600; an existing file is not replaced)
    /// and the public key line to `file` + ".pub".
    Result<void> save(const std::filesystem::path& file) const;

    [[nodiscard]] const PublicKey& public_key() const noexcept { return public_; }
    [[nodiscard]] const std::string& name() const noexcept { return name_; }
    /// `format_public_key(public_key(), name())`.
    [[nodiscard]] std::string public_line() const;
    /// This key's signature over `message`.
    [[nodiscard]] Signature sign(std::span<const std::byte> message) const noexcept;

    Identity(Identity&& other) noexcept;
    Identity& operator=(Identity&& other) noexcept;
    Identity(const Identity&) = delete;
    Identity& operator=(const Identity&) = delete;
    ~Identity();

private:
    Identity() = default;
    std::array<std::uint8_t, 64> secret_{}; // libsodium's form: seed, then public key
    PublicKey public_{};
    std::string name_;
};

} // namespace bitship
