// Identities: key files and their modes, public key lines, fingerprints, authorized keys files,
// and what the session and code signatures cover.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <bitship/identity.hpp>

#include "core/signing.hpp"

namespace identity_test_cpp {

using namespace bitship;
namespace fs = std::filesystem;

namespace {

struct TempDir {
    fs::path path;
    TempDir() {
        std::string templ = (fs::temp_directory_path() / "bitship-identity-test-XXXXXX").string();
        REQUIRE(mkdtemp(templ.data()));
        path = templ;
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
};

void write(const fs::path& p, const std::string& text, fs::perms mode = fs::perms::owner_read | fs::perms::owner_write) {
    std::ofstream(p) << text;
    fs::permissions(p, mode);
}

std::string read(const fs::path& p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

PublicKey counting_key() {
    PublicKey k{};
    for (std::size_t i = 0; i < k.size(); ++i) k[i] = static_cast<std::uint8_t>(i);
    return k;
}

} // namespace

TEST_CASE("a generated key saved mode 0600 loads back with the same public key, and its .pub holds the line", "[unit]") {
    TempDir dir;
    auto id = Identity::generate("alice@test");
    REQUIRE(id);
    REQUIRE(id->save(dir.path / "id"));
    struct stat st {};
    REQUIRE(stat((dir.path / "id").c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
    auto back = Identity::load(dir.path / "id");
    REQUIRE(back);
    CHECK(back->public_key() == id->public_key());
    CHECK(back->name() == "alice@test");
    CHECK(read(dir.path / "id.pub") == id->public_line() + "\n");
    // The loaded key signs what the generated one verifies.
    const std::string msg = "hello";
    auto sig = back->sign(std::as_bytes(std::span(msg.data(), msg.size())));
    CHECK(verify(id->public_key(), std::as_bytes(std::span(msg.data(), msg.size())), sig));
    // Never overwritten.
    auto again = id->save(dir.path / "id");
    REQUIRE(!again);
    CHECK(again.error().code == Errc::io_error);
    CHECK_THAT(again.error().message, Catch::Contains("never overwritten"));
}

TEST_CASE("a secret key file that group or others may read is refused, naming the file and its mode", "[unit]") {
    TempDir dir;
    auto id = Identity::generate("bob");
    REQUIRE(id);
    auto file = dir.path / "id";
    REQUIRE(id->save(file));
    fs::permissions(file, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::others_read);
    auto loaded = Identity::load(file);
    REQUIRE(!loaded);
    CHECK(loaded.error().code == Errc::invalid_argument);
    CHECK_THAT(loaded.error().message, Catch::Contains(file.string()) && Catch::Contains("0644"));
    fs::permissions(file, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
    auto group = Identity::load(file);
    REQUIRE(!group);
    CHECK_THAT(group.error().message, Catch::Contains("0640"));
}

TEST_CASE("a missing or malformed secret key file is refused by code, naming it", "[unit]") {
    TempDir dir;
    auto missing = Identity::load(dir.path / "nope");
    REQUIRE(!missing);
    CHECK(missing.error().code == Errc::io_error);
    CHECK_THAT(missing.error().message, Catch::Contains("nope"));
    write(dir.path / "pub", "ed25519 AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8= x\n");
    auto public_only = Identity::load(dir.path / "pub");
    REQUIRE(!public_only);
    CHECK(public_only.error().code == Errc::invalid_argument);
    CHECK_THAT(public_only.error().message, Catch::Contains("not a bitship secret key"));
}

TEST_CASE("public key lines and fingerprints read and print as SSH's do", "[unit]") {
    auto line = format_public_key(counting_key(), "carol laptop");
    CHECK(line == "ed25519 AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8= carol laptop");
    auto parsed = parse_public_key("  " + line + "  ");
    REQUIRE(parsed);
    CHECK(parsed->key == counting_key());
    CHECK(parsed->name == "carol laptop");
    // sha256 of bytes 0..31, base64 without padding (as ssh-keygen -l prints).
    CHECK(fingerprint(counting_key()) == "SHA256:Yw3NKWbEM2aRElRIu7JbT/QSpJxzLbLIq8G4WBvXEN0");
    CHECK(parse_public_key("ssh-rsa AAAA x").error().code == Errc::invalid_argument);
    CHECK(!parse_public_key("ed25519"));
    CHECK(!parse_public_key("ed25519 AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHg== short"));
    CHECK(!parse_public_key("ed25519 not*base64 x"));
}

TEST_CASE("an authorized keys file takes comments and blank lines, and names the line of a malformed key", "[unit]") {
    TempDir dir;
    auto a = Identity::generate("a"), b = Identity::generate("b");
    REQUIRE(a);
    REQUIRE(b);
    auto file = dir.path / "authorized_keys";
    write(file, "# operators\n\n" + a->public_line() + "\n   \n# more\n" + b->public_line() + "\n");
    auto keys = read_authorized_keys(file);
    REQUIRE(keys);
    REQUIRE(keys->size() == 2);
    CHECK((*keys)[0].key == a->public_key());
    CHECK((*keys)[1].name == "b");

    write(file, "# ok\n" + a->public_line() + "\ned25519 !!!garbage b\n");
    auto bad = read_authorized_keys(file);
    REQUIRE(!bad);
    CHECK(bad.error().code == Errc::invalid_argument);
    CHECK_THAT(bad.error().message, Catch::Contains(file.string() + " line 3"));

    write(file, a->public_line() + "\n", fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_write);
    auto writable = read_authorized_keys(file);
    REQUIRE(!writable);
    CHECK_THAT(writable.error().message, Catch::Contains("may write"));

    auto missing = read_authorized_keys(dir.path / "none");
    REQUIRE(!missing);
    CHECK(missing.error().code == Errc::io_error);
}

TEST_CASE("a session signature holds for its challenge, instance and key only, and a code signature is no session one", "[unit]") {
    auto id = Identity::generate("s");
    auto other = Identity::generate("o");
    REQUIRE(id);
    REQUIRE(other);
    auto challenge = signing::fresh_challenge();
    auto next = signing::fresh_challenge();
    CHECK(challenge != next);
    const std::uint64_t instance = 0x1234;
    auto sig = signing::sign_session(*id, challenge, instance);
    CHECK(signing::verify_session(id->public_key(), sig, challenge, instance));
    CHECK(!signing::verify_session(id->public_key(), sig, next, instance));         // replayed to another WELCOME
    CHECK(!signing::verify_session(id->public_key(), sig, challenge, instance + 1)); // to a restarted agent
    CHECK(!signing::verify_session(other->public_key(), sig, challenge, instance));  // claimed by another key

    CodeHash hash{};
    hash.fill(9);
    auto code_sig = signing::sign_code(*id, hash);
    CHECK(signing::verify_code(id->public_key(), code_sig, hash));
    CodeHash other_hash = hash;
    other_hash[0] ^= 1;
    CHECK(!signing::verify_code(id->public_key(), code_sig, other_hash));
    CHECK(!signing::verify_code(other->public_key(), code_sig, hash));
    signing::Challenge as_challenge{};
    std::copy(hash.begin(), hash.end(), as_challenge.begin());
    CHECK(!signing::verify_session(id->public_key(), code_sig, as_challenge, instance));
}

}  // namespace identity_test_cpp
