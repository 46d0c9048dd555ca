// Who may call an agent, and whose code it runs: real xagent processes with authorized keys,
// real clients with identities, over TCP and shared memory. Every refusal is checked by code and
// by the key it names, and after each the agent still answers an authorized client correctly.

#include <catch2/catch.hpp>

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <fmt/format.h>

#include <bitship/client.hpp>
#include <bitship/identity.hpp>
#include <behaviour_kernels.hpp>
#include <trust_kernels.hpp>

#include "core/signing.hpp"
#include "core/wire.hpp"
#include "launcher.hpp"
#include "raw_peer.hpp"

namespace auth_test_cpp {

using namespace bitship;
using bitship::launch::AgentProcess;
using bitship::test::RawPeer;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

struct TempDir {
    fs::path path = launch::make_temp_dir("bitship-auth-test-");
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
};

// A key pair saved at dir/name (mode 0600), and its public key.
struct Key {
    fs::path file;
    PublicKey key{};
    std::string fingerprint;
};

Key make_key(const fs::path& dir, const std::string& name) {
    auto id = Identity::generate(name);
    REQUIRE(id);
    Key k{dir / name, id->public_key(), bitship::fingerprint(id->public_key())};
    REQUIRE(id->save(k.file));
    return k;
}

Key test_key() {
    auto id = Identity::load(launch::test_keys().secret);
    REQUIRE(id);
    return {launch::test_keys().secret, id->public_key(), launch::test_keys().fingerprint};
}

// An authorized keys file holding `keys` (mode 0600); rewritten in place when it exists.
void write_authorized(const fs::path& file, const std::vector<Key>& keys, const std::string& extra = {}) {
    std::ofstream out(file, std::ios::trunc);
    out << "# written by auth_test\n";
    for (const auto& k : keys) out << format_public_key(k.key, k.file.filename().string()) << "\n";
    out << extra;
    out.close();
    fs::permissions(file, fs::perms::owner_read | fs::perms::owner_write);
}

Client make_client(const std::string& transport, const fs::path& identity = {}, const fs::path& author = {}) {
    ClientOptions o;
    o.transport = *parse_transport(transport);
    o.loopback_only = true;
    o.call_timeout = 20s;
    // The test key unless told otherwise (BITSHIP_IDENTITY is set only once an agent started).
    o.identity = identity.empty() && std::getenv("BITSHIP_IDENTITY") == nullptr ? launch::test_keys().secret : identity;
    o.author = author;
    auto c = Client::create(o);
    INFO((c ? std::string() : c.error().describe()));
    REQUIRE(c);
    return std::move(*c);
}

// A client with no key at all (BITSHIP_IDENTITY must be unset: NoIdentityEnv).
Client make_keyless_client(const std::string& transport) {
    ClientOptions o;
    o.transport = *parse_transport(transport);
    o.loopback_only = true;
    o.call_timeout = 20s;
    auto c = Client::create(o);
    REQUIRE(c);
    return std::move(*c);
}

// A benign, authorized client still gets the right answer.
void agent_still_serves(const std::string& transport, const AgentProcess& agent) {
    auto client = make_client(transport);
    auto t = client.connect(agent.address());
    INFO(agent.log());
    REQUIRE(t);
    auto r = client.ship(behaviour_kernels::add, *t, std::uint64_t{3}, std::uint64_t{4}).get_as<std::uint64_t>();
    REQUIRE(r);
    CHECK(*r == 7);
}

// Waits (bounded) until the agent's log says `text`: a SIGHUP's reload is done.
void wait_for_log(const AgentProcess& agent, const std::string& text, std::size_t occurrences = 1) {
    auto deadline = std::chrono::steady_clock::now() + 10s;
    auto count = [&] {
        auto log = agent.log();
        std::size_t n = 0;
        for (auto at = log.find(text); at != std::string::npos; at = log.find(text, at + 1)) ++n;
        return n;
    };
    while (count() < occurrences && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
    INFO(agent.log());
    REQUIRE(count() >= occurrences);
}

std::size_t occurrences(const std::string& text, const std::string& what) {
    std::size_t n = 0;
    for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
}

wire::Encoded run_of(std::uint64_t id) {
    wire::Run r;
    r.hash.fill(1);
    r.entry = "add";
    return wire::encode_run(id, r);
}

std::map<std::string, std::uint64_t> counters(Client& client, const Target& t) {
    auto s = client.agent_stats(t);
    REQUIRE(s);
    return {s->begin(), s->end()};
}

struct HopArgs {
    std::uint32_t to = 0, pad = 0;
    std::uint64_t value = 0;
};

// Clears BITSHIP_IDENTITY while it lives: a client made then has no key.
struct NoIdentityEnv {
    std::string saved = std::getenv("BITSHIP_IDENTITY") ? std::getenv("BITSHIP_IDENTITY") : "";
    NoIdentityEnv() { unsetenv("BITSHIP_IDENTITY"); }
    ~NoIdentityEnv() {
        if (!saved.empty()) setenv("BITSHIP_IDENTITY", saved.c_str(), 1);
    }
};

} // namespace

TEST_CASE("a client whose key the agent does not know is refused at connect, naming the key, and logged once", "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    INFO("transport " << transport);
    TempDir dir;
    AgentProcess agent(transport);
    auto stranger = make_key(dir.path, "stranger");
    auto client = make_client(transport, stranger.file);
    for (int attempt = 0; attempt < 3; ++attempt) {
        auto t = client.connect(agent.address());
        REQUIRE_FALSE(t);
        CHECK(t.error().code == Errc::unauthorized);
        CHECK(t.error().message == fmt::format("agent {} does not know key {}", agent.address(), stranger.fingerprint));
        CHECK(t.error().describe() ==
              fmt::format("unauthorized: agent {} does not know key {}", agent.address(), stranger.fingerprint));
    }
    agent_still_serves(transport, agent);
    // Three refusals, one log line for the key.
    CHECK(occurrences(agent.log(), stranger.fingerprint) == 1);
}

TEST_CASE("RUN, region lookup, stats, control and ping are refused before AUTH and after a refused AUTH", "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    INFO("transport " << transport);
    TempDir dir;
    AgentProcess agent(transport, {"--region", "data=1M"});
    RawPeer raw(transport, agent.port(), /*authenticate=*/false);
    REQUIRE(raw.access == AgentAccess::keys);
    auto calls = [&](std::uint64_t base) {
        raw.send(run_of(base));
        raw.send(wire::encode_region(base + 1, "data"));
        raw.send(wire::encode_stats(base + 2));
        raw.send(wire::encode_request(wire::Type::kernel_stats, base + 3));
        raw.send(wire::encode_ping(wire::Type::ping, base + 4, {}));
        std::vector<std::pair<Errc, std::string>> out;
        for (std::uint64_t id = base; id < base + 5; ++id) out.push_back(raw.error_for(id));
        return out;
    };
    for (const auto& [code, message] : calls(10)) {
        CHECK(code == Errc::unauthorized);
        CHECK_THAT(message, Catch::Contains("has not authenticated"));
    }
    auto stranger_id = Identity::generate("stranger");
    REQUIRE(stranger_id);
    auto fp = fingerprint(stranger_id->public_key());
    raw.send(wire::encode_auth(20, raw.auth_by(*stranger_id)));
    auto [auth_code, auth_message] = raw.error_for(20);
    CHECK(auth_code == Errc::unauthorized);
    CHECK(auth_message == "does not know key " + fp);
    for (const auto& [code, message] : calls(30)) {
        CHECK(code == Errc::unauthorized);
        CHECK_THAT(message, Catch::Contains(fp));
    }
    agent_still_serves(transport, agent);
}

TEST_CASE("a recorded handshake is refused on another connection and by the restarted agent", "[integration]") {
    auto port = launch::free_port();
    auto me = Identity::load(launch::test_keys().secret);
    REQUIRE(me);
    wire::Auth recorded;
    std::array<std::uint8_t, 32> first_challenge{};
    std::uint64_t first_instance = 0;
    {
        AgentProcess agent("tcp", {}, port);
        RawPeer a("tcp", port, false);
        recorded = a.auth_by(*me);
        first_challenge = a.challenge;
        first_instance = a.instance;
        a.send(wire::encode_auth(5, recorded));
        REQUIRE(a.wait(wire::Type::ack, 5)); // valid where it was made

        RawPeer b("tcp", port, false);
        CHECK(b.challenge != first_challenge);
        b.send(wire::encode_auth(6, recorded));
        auto [code, message] = b.error_for(6);
        CHECK(code == Errc::unauthorized);
        CHECK_THAT(message, Catch::Contains("not over this connection's challenge"));
        b.send(run_of(7));
        CHECK(b.error_for(7).first == Errc::unauthorized);
        // The connection the handshake was made on answered one AUTH: a second use of its
        // challenge is refused too.
        a.send(wire::encode_auth(8, recorded));
        CHECK(a.error_for(8).first == Errc::unauthorized);
        agent_still_serves("tcp", agent);
    }
    AgentProcess restarted("tcp", {}, port);
    RawPeer c("tcp", port, false);
    CHECK(c.instance != first_instance);
    CHECK(c.challenge != first_challenge);
    c.send(wire::encode_auth(9, recorded));
    auto [code, message] = c.error_for(9);
    CHECK(code == Errc::unauthorized);
    CHECK_THAT(message, Catch::Contains("replayed or forged"));
    c.send(run_of(10));
    CHECK(c.error_for(10).first == Errc::unauthorized);
    agent_still_serves("tcp", restarted);
}

TEST_CASE("a stolen key removed from the authorized keys and SIGHUP sent is refused from its next call on, and the other key works",
          "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    INFO("transport " << transport);
    TempDir dir;
    auto stolen = make_key(dir.path, "stolen"), kept = make_key(dir.path, "kept");
    auto file = dir.path / "authorized_keys";
    write_authorized(file, {stolen, kept, test_key()});
    AgentProcess agent(transport, {"--authorized-keys", file.string()});

    auto thief = make_client(transport, stolen.file);
    auto thief_target = thief.connect(agent.address());
    REQUIRE(thief_target);
    CHECK(thief_target->info().access == AgentAccess::keys);
    REQUIRE(thief.ship(behaviour_kernels::add, *thief_target, std::uint64_t{1}, std::uint64_t{2}).get_as<std::uint64_t>() == 3);
    auto owner = make_client(transport, kept.file);
    auto owner_target = owner.connect(agent.address());
    REQUIRE(owner_target);

    write_authorized(file, {kept, test_key()});
    REQUIRE(kill(agent.pid(), SIGHUP) == 0);
    wait_for_log(agent, "authorized keys reloaded");

    // Its open session can make no more calls; a new session is refused, naming the key.
    auto late = thief.ship(behaviour_kernels::add, *thief_target, std::uint64_t{1}, std::uint64_t{2}).get();
    REQUIRE_FALSE(late);
    CHECK(late.error().code == Errc::unauthorized);
    CHECK_THAT(late.error().message, Catch::Contains(stolen.fingerprint) && Catch::Contains("removed"));
    auto thief2 = make_client(transport, stolen.file);
    auto refused = thief2.connect(agent.address());
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == Errc::unauthorized);
    CHECK(refused.error().message == fmt::format("agent {} does not know key {}", agent.address(), stolen.fingerprint));

    auto still = owner.ship(behaviour_kernels::add, *owner_target, std::uint64_t{20}, std::uint64_t{22}).get_as<std::uint64_t>();
    REQUIRE(still);
    CHECK(*still == 42);

    // A malformed file on SIGHUP: the set in force stays, the log names the line.
    write_authorized(file, {kept}, "ed25519 !!!not-base64 broken\n");
    REQUIRE(kill(agent.pid(), SIGHUP) == 0);
    wait_for_log(agent, "keeping the authorized keys in force");
    CHECK_THAT(agent.log(), Catch::Contains("line 3"));
    auto thief3 = make_client(transport, stolen.file);
    CHECK(thief3.connect(agent.address()).error().code == Errc::unauthorized);
    agent_still_serves(transport, agent); // the test key is still in force
}

TEST_CASE("code signed by an author the agent does not authorize is refused, even from an authorized session", "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    INFO("transport " << transport);
    TempDir dir;
    AgentProcess agent(transport);
    auto outsider = make_key(dir.path, "outsider");
    auto client = make_client(transport, launch::test_keys().secret, outsider.file);
    auto t = client.connect(agent.address());
    REQUIRE(t); // the session is authorized ...
    for (int attempt = 0; attempt < 2; ++attempt) {
        auto r = client.ship(behaviour_kernels::add, *t, std::uint64_t{1}, std::uint64_t{1}).get();
        REQUIRE_FALSE(r); // ... its code's author is not
        CHECK(r.error().code == Errc::unauthorized);
        CHECK_THAT(r.error().message, Catch::Contains("is signed by key " + outsider.fingerprint));
    }
    auto c = counters(client, *t);
    CHECK(c["compiles"] == 0);
    CHECK(c["unauthorized"] >= 2);
    agent_still_serves(transport, agent); // the same code, signed by an authorized author, runs
}

TEST_CASE("new code whose signature does not verify is refused though its author is authorized, and never runs", "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    INFO("transport " << transport);
    AgentProcess agent(transport);
    RawPeer raw(transport, agent.port()); // an authorized session
    auto bundle = behaviour_kernels::bundle();
    auto view = BundleView::parse(bundle);
    REQUIRE(view);
    auto slice = view->find_slice("x86_64-unknown-linux-gnu"); // behaviour_kernels' one CPU slice
    REQUIRE(slice);
    auto code = extract_slice(*view, *slice);
    const std::uint64_t args[2] = {1, 2};
    wire::Run run;
    run.hash = view->slices[*slice].hash;
    run.entry = "add";
    run.code = code;
    run.args = std::as_bytes(std::span(args));
    auto author = Identity::load(launch::test_keys().secret); // an authorized author ...
    REQUIRE(author);
    auto forged = signing::sign_code(*author, run.hash);
    forged[7] ^= 0x40; // ... whose signature is not its own
    run.signatures = {{run.hash, author->public_key(), forged}};
    raw.send(wire::encode_run(31, run));
    auto [code31, message31] = raw.error_for(31);
    CHECK(code31 == Errc::unauthorized);
    CHECK_THAT(message31, Catch::Contains("does not verify"));

    agent_still_serves(transport, agent); // the same code, rightly signed, runs
    auto client = make_client(transport);
    auto t = client.connect(agent.address());
    REQUIRE(t);
    auto c = counters(client, *t);
    CHECK(c["unauthorized"] == 1);
    CHECK(c["results"] == 1);  // the refused call never ran ...
    CHECK(c["compiles"] == 1); // ... nor was compiled: the code was, once, for the call that ran
}

TEST_CASE("forwarded code keeps its author's signature, so the next agent checks the author, not the forwarder",
          "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    INFO("transport " << transport);
    TempDir dir;
    auto author = make_key(dir.path, "author");
    auto both = dir.path / "both", forwarder_only = dir.path / "forwarder_only";
    // The agents present the test key to each other (BITSHIP_IDENTITY), as the client does.
    write_authorized(both, {test_key(), author});
    write_authorized(forwarder_only, {test_key()});
    AgentProcess first(transport, {"--authorized-keys", both.string()});
    AgentProcess trusting(transport, {"--authorized-keys", both.string()});
    AgentProcess wary(transport, {"--authorized-keys", forwarder_only.string()});

    auto client = make_client(transport, launch::test_keys().secret, author.file);
    auto a = client.connect(first.address()), b = client.connect(trusting.address()), w = client.connect(wary.address());
    REQUIRE(a);
    REQUIRE(b);
    REQUIRE(w);
    ShipOptions to_trusting;
    to_trusting.peers = {*a, *b};
    auto ok = client.ship(trust_kernels::hop, *a, to_trusting, HopArgs{1, 0, 4}).get_as<std::uint64_t>();
    INFO(first.log() << trusting.log());
    REQUIRE(ok);
    CHECK(*ok == 41); // answered by peer 1, the trusting agent

    ShipOptions to_wary;
    to_wary.peers = {*a, *w};
    auto refused = client.ship(trust_kernels::hop, *a, to_wary, HopArgs{1, 0, 4}).get();
    INFO(wary.log());
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == Errc::unauthorized);
    CHECK_THAT(refused.error().message, Catch::Contains(fmt::format("agent {}", wary.address())) &&
                                            Catch::Contains("is signed by key " + author.fingerprint));
    // The wary agent authorizes the forwarder's key: the session was not what it refused.
    CHECK(counters(client, *w)["compiles"] == 0);
    agent_still_serves(transport, wary);
    agent_still_serves(transport, first);
}

TEST_CASE("a peer that does not know the forwarding agent's key refuses the forward, and the caller hears why",
          "[integration]") {
    TempDir dir;
    auto client_key = make_key(dir.path, "client");
    auto file = dir.path / "client_only";
    write_authorized(file, {client_key});
    AgentProcess first("tcp", {"--authorized-keys", file.string()});
    // The second agent knows the client, not the first agent (it presents the test key).
    AgentProcess second("tcp", {"--authorized-keys", file.string()});
    auto client = make_client("tcp", client_key.file);
    auto a = client.connect(first.address()), b = client.connect(second.address());
    REQUIRE(a);
    REQUIRE(b);
    ShipOptions options;
    options.peers = {*a, *b};
    auto r = client.ship(trust_kernels::hop, *a, options, HopArgs{1, 0, 4}).get();
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::unauthorized);
    CHECK_THAT(r.error().message, Catch::Contains(fmt::format("peer {} does not know key {}", second.address(),
                                                              launch::test_keys().fingerprint)));
    auto local = client.ship(behaviour_kernels::add, *b, std::uint64_t{2}, std::uint64_t{3}).get_as<std::uint64_t>();
    REQUIRE(local);
    CHECK(*local == 5);
}

TEST_CASE("secret key files others may read are refused by clients and agents, and a malformed authorized key is named",
          "[integration]") {
    TempDir dir;
    auto key = make_key(dir.path, "loose");
    fs::permissions(key.file, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::others_read);
    ClientOptions o;
    o.identity = key.file;
    auto c = Client::create(o);
    REQUIRE_FALSE(c);
    CHECK(c.error().code == Errc::invalid_argument);
    CHECK_THAT(c.error().message, Catch::Contains(key.file.string()) && Catch::Contains("mode 0644"));

    CHECK_THROWS_WITH(AgentProcess("tcp", {"--identity", key.file.string()}),
                      Catch::Contains("mode 0644") && Catch::Contains(key.file.string()));
    auto file = dir.path / "authorized_keys";
    write_authorized(file, {test_key()}, "ed25519 AAAA too-short\n");
    CHECK_THROWS_WITH(AgentProcess("tcp", {"--authorized-keys", file.string()}),
                      Catch::Contains(file.string() + " line 3"));
}

TEST_CASE("xctl key makes a 0600 key and prints its fingerprint, and xctl without a key is refused by a keyed agent",
          "[integration]") {
    TempDir dir;
    auto run = [](const std::string& cmd) {
        std::string out;
        FILE* p = popen(cmd.c_str(), "r");
        REQUIRE(p);
        char buf[4096];
        while (auto n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
        int status = pclose(p);
        return std::pair{WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
    };
    auto key = dir.path / "k";
    auto [rc, line] = run(fmt::format("{} key generate {} --name ops@test 2>/dev/null", BITSHIP_XCTL, key.string()));
    REQUIRE(rc == 0);
    CHECK(line.rfind("ed25519 ", 0) == 0);
    CHECK_THAT(line, Catch::EndsWith(" ops@test\n"));
    struct stat st {};
    REQUIRE(stat(key.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
    auto id = Identity::load(key);
    REQUIRE(id);
    auto [rc2, fp] = run(fmt::format("{} key fingerprint {}.pub", BITSHIP_XCTL, key.string()));
    CHECK(rc2 == 0);
    CHECK(fp == fingerprint(id->public_key()) + " ops@test\n");
    auto [rc3, pub] = run(fmt::format("{} key public {}", BITSHIP_XCTL, key.string()));
    CHECK(rc3 == 0);
    CHECK(pub == line);

    AgentProcess agent("tcp");
    auto [rc4, refused] = run(fmt::format("env -u BITSHIP_IDENTITY {} --loopback --agent {} --json info", BITSHIP_XCTL,
                                          agent.address()));
    CHECK(rc4 == 1);
    CHECK_THAT(refused, Catch::Contains("unauthorized") && Catch::Contains("admits authorized keys only"));
    auto [rc5, info] = run(fmt::format("env -u BITSHIP_IDENTITY {} --loopback --identity {} --agent {} --json info",
                                       BITSHIP_XCTL, launch::test_keys().secret.string(), agent.address()));
    CHECK(rc5 == 0);
    CHECK_THAT(info, Catch::Contains("keys (1 authorized; signed code only)"));
}

TEST_CASE("open access admits clients without keys on loopback, beyond it only with --insecure, which WELCOME says",
          "[integration]") {
    launch::AgentProgram open_program;
    open_program.path = launch::AgentProcess::binary();
    open_program.open = true;
    {
        AgentProcess agent(open_program, "tcp");
        NoIdentityEnv no_key;
        auto client = make_keyless_client("tcp");
        auto t = client.connect(agent.address());
        REQUIRE(t);
        CHECK(t->info().access == AgentAccess::open);
        auto r = client.ship(behaviour_kernels::add, *t, std::uint64_t{1}, std::uint64_t{2}).get_as<std::uint64_t>();
        REQUIRE(r);
        CHECK(*r == 3);
    }
    {
        AgentProcess keyed("tcp");
        NoIdentityEnv no_key;
        auto client = make_keyless_client("tcp");
        auto t = client.connect(keyed.address());
        REQUIRE_FALSE(t);
        CHECK(t.error().code == Errc::unauthorized);
        CHECK_THAT(t.error().message, Catch::Contains("admits authorized keys only"));
    }
    auto everywhere = open_program;
    everywhere.listen_host = "0.0.0.0";
    CHECK_THROWS_WITH(AgentProcess(everywhere, "tcp"), Catch::Contains("not loopback") && Catch::Contains("--insecure"));
    AgentProcess insecure(everywhere, "tcp", {"--insecure"});
    CHECK_THAT(insecure.log(), Catch::Contains("INSECURE"));
    auto client = make_client("tcp");
    auto t = client.connect(insecure.address());
    REQUIRE(t);
    CHECK(t->info().access == AgentAccess::insecure);
    auto r = client.ship(behaviour_kernels::add, *t, std::uint64_t{5}, std::uint64_t{6}).get_as<std::uint64_t>();
    REQUIRE(r);
    CHECK(*r == 11);
}

TEST_CASE("code loaded from the disk cache after a restart keeps its author's signature, so nothing is resent", "[integration]") {
    TempDir dir;
    auto port = launch::free_port();
    auto client = make_client("tcp");
    {
        AgentProcess agent("tcp", {"--cache-dir", dir.path.string()}, port);
        auto t = client.connect(agent.address());
        REQUIRE(t);
        REQUIRE(client.ship(behaviour_kernels::add, *t, std::uint64_t{1}, std::uint64_t{2}).get_as<std::uint64_t>() == 3);
    }
    std::size_t signature_files = 0;
    for (const auto& e : fs::directory_iterator(dir.path / "signatures")) signature_files += e.path().extension() == ".sig";
    CHECK(signature_files == 1);
    AgentProcess restarted("tcp", {"--cache-dir", dir.path.string()}, port);
    auto t = client.connect(restarted.address());
    REQUIRE(t);
    auto r = client.ship(behaviour_kernels::add, *t, std::uint64_t{20}, std::uint64_t{22}).get_as<std::uint64_t>();
    INFO(restarted.log());
    REQUIRE(r);
    CHECK(*r == 42);
    CHECK(client.stats().need_code_received == 0);
    CHECK(client.stats().bundles_sent == 1);
    auto c = counters(client, *t);
    CHECK(c["code_received"] == 0); // the restarted agent took the code from its disk cache
    CHECK(c["need_code_sent"] == 0);
}

}  // namespace auth_test_cpp
