// Ed25519 identities (libsodium): key files, public key lines, fingerprints, authorized keys.
#include <bitship/identity.hpp>

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <sodium.h>

namespace bitship {
namespace {

constexpr std::string_view kPublicTag = "ed25519";
constexpr std::string_view kSecretTag = "ed25519-secret";
constexpr std::string_view kSecretHeader = "# bitship secret key: keep it private (mode 0600)\n";
constexpr std::size_t kMaxKeyFile = 64 * 1024;          // a key file is a line or two
constexpr std::size_t kMaxAuthorizedKeys = 1024 * 1024; // an authorized keys file: bytes

static_assert(crypto_sign_PUBLICKEYBYTES == std::tuple_size_v<PublicKey>);
static_assert(crypto_sign_BYTES == std::tuple_size_v<Signature>);
static_assert(crypto_sign_SECRETKEYBYTES == 64 && crypto_sign_SEEDBYTES == 32);

bool sodium_ready() {
    static const bool ready = sodium_init() >= 0;
    return ready;
}

std::string to_base64(std::span<const std::uint8_t> bytes, int variant) {
    std::string out(sodium_base64_encoded_len(bytes.size(), variant), '\0');
    sodium_bin2base64(out.data(), out.size(), bytes.data(), bytes.size(), variant);
    out.resize(std::strlen(out.c_str()));
    return out;
}

// Exactly `out.size()` bytes from base64 `text` (padded or not).
bool from_base64(std::string_view text, std::span<std::uint8_t> out) {
    std::size_t len = 0;
    const char* end = nullptr;
    for (int variant : {sodium_base64_VARIANT_ORIGINAL, sodium_base64_VARIANT_ORIGINAL_NO_PADDING}) {
        if (sodium_base642bin(out.data(), out.size(), text.data(), text.size(), nullptr, &len, &end, variant) == 0 &&
            end == text.data() + text.size() && len == out.size())
            return true;
    }
    return false;
}

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
    return s;
}

// "TAG BASE64 [NAME...]" split into its three parts; the name may hold spaces.
struct KeyLine {
    std::string_view tag, base64, name;
};
KeyLine split_key_line(std::string_view line) {
    line = trim(line);
    KeyLine k;
    auto space = line.find_first_of(" \t");
    k.tag = line.substr(0, space);
    if (space == std::string_view::npos) return k;
    auto rest = trim(line.substr(space));
    space = rest.find_first_of(" \t");
    k.base64 = rest.substr(0, space);
    if (space != std::string_view::npos) k.name = trim(rest.substr(space));
    return k;
}

std::string default_name() {
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
    const char* user = std::getenv("USER");
    if (!user || !*user) {
        if (const auto* pw = getpwuid(getuid())) user = pw->pw_name;
    }
    return fmt::format("{}@{}", user && *user ? user : "user", host);
}

std::string mode_text(mode_t mode) { return fmt::format("{:04o}", mode & 07777); }

// Reads a whole small file through `fd`, which this closes.
Result<std::string> read_fd(int fd, const std::filesystem::path& file, std::size_t limit) {
    std::string text;
    char buf[4096];
    for (;;) {
        auto n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            auto err = errno;
            ::close(fd);
            return fail(Errc::io_error, fmt::format("cannot read {}: {}", file.string(), std::strerror(err)));
        }
        if (n == 0) break;
        text.append(buf, static_cast<std::size_t>(n));
        if (text.size() > limit) {
            ::close(fd);
            return fail(Errc::invalid_argument, fmt::format("{} is larger than {} bytes: not a key file", file.string(), limit));
        }
    }
    ::close(fd);
    return text;
}

} // namespace

std::string_view to_string(AgentAccess access) noexcept {
    switch (access) {
    case AgentAccess::open: return "open";
    case AgentAccess::keys: return "keys";
    case AgentAccess::insecure: return "insecure";
    }
    return "unknown";
}

std::string fingerprint(const PublicKey& key) {
    std::array<std::uint8_t, crypto_hash_sha256_BYTES> digest{};
    crypto_hash_sha256(digest.data(), key.data(), key.size());
    return "SHA256:" + to_base64(digest, sodium_base64_VARIANT_ORIGINAL_NO_PADDING);
}

std::string format_public_key(const PublicKey& key, std::string_view name) {
    auto line = fmt::format("{} {}", kPublicTag, to_base64(key, sodium_base64_VARIANT_ORIGINAL));
    if (!name.empty()) line += fmt::format(" {}", name);
    return line;
}

Result<NamedKey> parse_public_key(std::string_view line) {
    auto k = split_key_line(line);
    if (k.tag != kPublicTag)
        return fail(Errc::invalid_argument,
                    fmt::format("'{}' is not a key type this build knows (expected '{}')", k.tag.substr(0, 40), kPublicTag));
    if (k.base64.empty()) return fail(Errc::invalid_argument, "the key itself is missing after 'ed25519'");
    NamedKey out;
    if (!from_base64(k.base64, out.key))
        return fail(Errc::invalid_argument, fmt::format("'{}' is not the base64 of a 32-byte Ed25519 key",
                                                        k.base64.substr(0, 60)));
    out.name = std::string(k.name);
    return out;
}

Result<std::vector<NamedKey>> read_authorized_keys(const std::filesystem::path& file) {
    int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return fail(Errc::io_error, fmt::format("cannot open authorized keys file {}: {}", file.string(), std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        return fail(Errc::io_error, fmt::format("authorized keys file {} is not a regular file", file.string()));
    }
    // Whoever may write the file decides who may run code here.
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        ::close(fd);
        return fail(Errc::invalid_argument,
                    fmt::format("authorized keys file {} has mode {}: group or others may write it (chmod go-w {})",
                                file.string(), mode_text(st.st_mode), file.string()));
    }
    auto text = read_fd(fd, file, kMaxAuthorizedKeys);
    if (!text) return tl::make_unexpected(text.error());
    std::vector<NamedKey> keys;
    std::istringstream in(*text);
    std::string line;
    for (unsigned number = 1; std::getline(in, line); ++number) {
        auto t = trim(line);
        if (t.empty() || t.front() == '#') continue;
        auto key = parse_public_key(t);
        if (!key)
            return fail(Errc::invalid_argument,
                        fmt::format("authorized keys file {} line {}: {}", file.string(), number, key.error().message));
        keys.push_back(std::move(*key));
    }
    return keys;
}

bool verify(const PublicKey& key, std::span<const std::byte> message, const Signature& signature) noexcept {
    if (!sodium_ready()) return false;
    return crypto_sign_verify_detached(signature.data(), reinterpret_cast<const unsigned char*>(message.data()),
                                       message.size(), key.data()) == 0;
}

Result<Identity> Identity::generate(std::string name) {
    if (!sodium_ready()) return fail(Errc::internal, "libsodium could not initialise");
    Identity id;
    crypto_sign_keypair(id.public_.data(), id.secret_.data());
    id.name_ = name.empty() ? default_name() : std::move(name);
    return id;
}

Result<Identity> Identity::load(const std::filesystem::path& file) {
    if (!sodium_ready()) return fail(Errc::internal, "libsodium could not initialise");
    int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail(Errc::io_error, fmt::format("cannot open secret key file {}: {}", file.string(), std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        return fail(Errc::io_error, fmt::format("secret key file {} is not a regular file", file.string()));
    }
    if (st.st_mode & (S_IRWXG | S_IRWXO)) {
        ::close(fd);
        return fail(Errc::invalid_argument,
                    fmt::format("secret key file {} has mode {}: group or others may read it; refusing to use it "
                                "(chmod 600 {})",
                                file.string(), mode_text(st.st_mode), file.string()));
    }
    auto text = read_fd(fd, file, kMaxKeyFile);
    if (!text) return tl::make_unexpected(text.error());
    std::istringstream in(*text);
    std::string line;
    while (std::getline(in, line)) {
        auto t = trim(line);
        if (t.empty() || t.front() == '#') continue;
        auto k = split_key_line(t);
        std::array<std::uint8_t, crypto_sign_SEEDBYTES> seed{};
        if (k.tag != kSecretTag || !from_base64(k.base64, seed)) {
            sodium_memzero(seed.data(), seed.size());
            return fail(Errc::invalid_argument,
                        fmt::format("{} is not a bitship secret key (expected a line '{} <base64 seed> NAME'; "
                                    "make one with: xctl key generate FILE)",
                                    file.string(), kSecretTag));
        }
        Identity id;
        crypto_sign_seed_keypair(id.public_.data(), id.secret_.data(), seed.data());
        sodium_memzero(seed.data(), seed.size());
        id.name_ = std::string(k.name);
        return id;
    }
    return fail(Errc::invalid_argument, fmt::format("{} holds no key (make one with: xctl key generate FILE)", file.string()));
}

Result<void> Identity::save(const std::filesystem::path& file) const {
    int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return fail(Errc::io_error, fmt::format("cannot create secret key file {}: {}{}", file.string(), std::strerror(errno),
                                                errno == EEXIST ? " (a key is never overwritten: remove it first)" : ""));
    ::fchmod(fd, 0600); // whatever the umask said
    std::array<std::uint8_t, crypto_sign_SEEDBYTES> seed{};
    crypto_sign_ed25519_sk_to_seed(seed.data(), secret_.data());
    std::string text = std::string(kSecretHeader) +
                       fmt::format("{} {} {}\n", kSecretTag, to_base64(seed, sodium_base64_VARIANT_ORIGINAL), name_);
    sodium_memzero(seed.data(), seed.size());
    bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    sodium_memzero(text.data(), text.size());
    ok = ::close(fd) == 0 && ok;
    if (!ok) return fail(Errc::io_error, fmt::format("cannot write secret key file {}", file.string()));
    auto pub = file;
    pub += ".pub";
    std::ofstream out(pub, std::ios::trunc);
    out << public_line() << "\n";
    if (!out) return fail(Errc::io_error, fmt::format("cannot write public key file {}", pub.string()));
    return {};
}

std::string Identity::public_line() const { return format_public_key(public_, name_); }

Signature Identity::sign(std::span<const std::byte> message) const noexcept {
    Signature s{};
    crypto_sign_detached(s.data(), nullptr, reinterpret_cast<const unsigned char*>(message.data()), message.size(),
                         secret_.data());
    return s;
}

Identity::Identity(Identity&& other) noexcept : secret_(other.secret_), public_(other.public_), name_(std::move(other.name_)) {
    sodium_memzero(other.secret_.data(), other.secret_.size());
}

Identity& Identity::operator=(Identity&& other) noexcept {
    if (this != &other) {
        secret_ = other.secret_;
        public_ = other.public_;
        name_ = std::move(other.name_);
        sodium_memzero(other.secret_.data(), other.secret_.size());
    }
    return *this;
}

Identity::~Identity() { sodium_memzero(secret_.data(), secret_.size()); }

} // namespace bitship
