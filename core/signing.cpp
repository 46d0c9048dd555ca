#include "signing.hpp"

#include <cstring>
#include <string_view>

#include <sodium.h>

namespace bitship::signing {
namespace {

// The tags travel with their terminating NUL, so no tag is a prefix of another's message.
constexpr std::string_view kSessionTag{"bitship-session-v1", sizeof("bitship-session-v1")};
constexpr std::string_view kCodeTag{"bitship-code-v1", sizeof("bitship-code-v1")};

constexpr std::size_t kSessionBytes = kSessionTag.size() + sizeof(Challenge) + sizeof(std::uint64_t) + sizeof(PublicKey);
constexpr std::size_t kCodeBytes = kCodeTag.size() + sizeof(CodeHash);

using SessionMessage = std::array<std::byte, kSessionBytes>;
using CodeMessage = std::array<std::byte, kCodeBytes>;

SessionMessage session_message(const Challenge& challenge, std::uint64_t instance, const PublicKey& key) {
    SessionMessage m{};
    auto* p = m.data();
    std::memcpy(p, kSessionTag.data(), kSessionTag.size());
    p += kSessionTag.size();
    std::memcpy(p, challenge.data(), challenge.size());
    p += challenge.size();
    std::memcpy(p, &instance, sizeof instance); // little-endian hosts only (core/byte_io.hpp)
    p += sizeof instance;
    std::memcpy(p, key.data(), key.size());
    return m;
}

CodeMessage code_message(const CodeHash& hash) {
    CodeMessage m{};
    std::memcpy(m.data(), kCodeTag.data(), kCodeTag.size());
    std::memcpy(m.data() + kCodeTag.size(), hash.data(), hash.size());
    return m;
}

} // namespace

Challenge fresh_challenge() {
    static const bool ready = sodium_init() >= 0; // once; thread-safe
    (void)ready;
    Challenge c{};
    randombytes_buf(c.data(), c.size());
    return c;
}

Signature sign_session(const Identity& who, const Challenge& challenge, std::uint64_t instance) {
    return who.sign(session_message(challenge, instance, who.public_key()));
}

bool verify_session(const PublicKey& key, const Signature& signature, const Challenge& challenge,
                    std::uint64_t instance) noexcept {
    return verify(key, session_message(challenge, instance, key), signature);
}

Signature sign_code(const Identity& author, const CodeHash& hash) { return author.sign(code_message(hash)); }

bool verify_code(const PublicKey& key, const Signature& signature, const CodeHash& hash) noexcept {
    return verify(key, code_message(hash), signature);
}

} // namespace bitship::signing
