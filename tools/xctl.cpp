// xctl: the operator's tool for running agents. Asks one agent (--agent) or every agent of a
// job's peers file (--peers-file) and prints what they say, as text or JSON (--json).
//
//   xctl --agent 127.0.0.1:7000 info
//   xctl --peers-file /run/bitship/peers --json stats
//   xctl --agent 127.0.0.1:7000 cache evict 3f2a...   (64 hex digits)
//   xctl --agent 127.0.0.1:7000 drain
//   xctl key generate ~/.bitship/id      (secret key, mode 0600; the public line goes to id.pub)
//   xctl --identity ~/.bitship/id --agent 10.0.0.2:7000 info   (an agent with authorized keys)

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <bitship/client.hpp>
#include <bitship/identity.hpp>
#include <bitship/peers.hpp>

#include "core/wire.hpp"

namespace {

using namespace bitship;
using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

constexpr int kExitFailed = 1; // some agent failed the request or could not be reached
constexpr int kExitUsage = 2;

struct Options {
    std::string agent;
    std::string peers_file;
    bool json = false;
    std::string transport = "any";
    unsigned timeout_ms = 3000;
    bool loopback = false;
    unsigned ping_count = 3;
    std::string hash;
    std::string identity;
    std::string key_file;
    std::string key_name;
};

// One request to one agent: its answer as JSON, or an error.
using Action = std::function<Result<json>(Client&, const Target&)>;

Result<wire::Message> decode_reply(wire::Type type, const Bytes& bytes) {
    wire::Header h;
    h.type = type;
    h.payload_size = static_cast<std::uint32_t>(bytes.size());
    return wire::decode(h, bytes);
}

std::string errc_name(std::uint32_t code) {
    return code <= static_cast<std::uint32_t>(kLastErrc) ? std::string(to_string(static_cast<Errc>(code)))
                                                          : fmt::format("errc_{}", code);
}

json errors_json(const std::vector<wire::ErrorCount>& errors) {
    json out = json::object();
    for (const auto& e : errors) out[errc_name(e.code)] = e.count;
    return out;
}

Result<json> do_ping(Client& client, const Target& t, unsigned count) {
    std::vector<double> us;
    for (unsigned i = 0; i < std::max(1u, count); ++i) {
        auto began = Clock::now();
        auto r = client.ping(t).get();
        if (!r) return tl::make_unexpected(r.error());
        us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - began).count());
    }
    std::sort(us.begin(), us.end());
    return json{{"pings", us.size()}, {"min_us", us.front()}, {"median_us", us[us.size() / 2]}, {"max_us", us.back()},
                {"instance", fmt::format("{:016x}", t.info().instance)}};
}

Result<json> do_info(Client& client, const Target& t) {
    auto bytes = client.control(t, static_cast<std::uint8_t>(wire::Type::info));
    if (!bytes) return tl::make_unexpected(bytes.error());
    auto msg = decode_reply(wire::Type::info_reply, *bytes);
    if (!msg) return tl::make_unexpected(msg.error());
    json out = json::object();
    for (const auto& [k, v] : std::get<wire::Fields>(msg->body).fields) out[std::string(k)] = std::string(v);
    return out;
}

Result<json> do_stats(Client& client, const Target& t) {
    auto bytes = client.control(t, static_cast<std::uint8_t>(wire::Type::kernel_stats));
    if (!bytes) return tl::make_unexpected(bytes.error());
    auto msg = decode_reply(wire::Type::kernel_stats_reply, *bytes);
    if (!msg) return tl::make_unexpected(msg.error());
    const auto& s = std::get<wire::KernelStatsReply>(msg->body);
    json kernels = json::array(), clients = json::array();
    for (const auto& k : s.kernels)
        kernels.push_back({{"hash", to_hex(k.hash)},
                           {"entry", std::string(k.entry)},
                           {"calls", k.calls},
                           {"errors", errors_json(k.errors)},
                           {"compile_ms", {{"first", k.compile_ns_first / 1e6}, {"optimised", k.compile_ns_optimised / 1e6}}},
                           {"runs", k.runs},
                           {"run_us", {{"p50", k.run_p50_ns / 1e3}, {"p99", k.run_p99_ns / 1e3}}},
                           {"bytes_in", k.bytes_in},
                           {"bytes_out", k.bytes_out}});
    for (const auto& c : s.clients)
        clients.push_back({{"client", std::string(c.client)},
                           {"calls", c.calls},
                           {"errors", errors_json(c.errors)},
                           {"bytes_in", c.bytes_in},
                           {"bytes_out", c.bytes_out}});
    auto counters = client.agent_stats(t);
    json agent = json::object();
    if (counters)
        for (const auto& [k, v] : *counters) agent[k] = v;
    return json{{"kernels", kernels}, {"clients", clients}, {"counters", agent}};
}

Result<json> do_cache_list(Client& client, const Target& t) {
    auto bytes = client.control(t, static_cast<std::uint8_t>(wire::Type::cache_list));
    if (!bytes) return tl::make_unexpected(bytes.error());
    auto msg = decode_reply(wire::Type::cache_list_reply, *bytes);
    if (!msg) return tl::make_unexpected(msg.error());
    json out = json::array();
    for (const auto& e : std::get<wire::CacheList>(msg->body).entries)
        out.push_back({{"hash", to_hex(e.hash)},
                       {"memory_bytes", e.memory_bytes},
                       {"disk_bytes", e.disk_bytes},
                       {"idle_ms", e.idle_ms},
                       {"in_use", e.in_use}});
    return json{{"cache", out}};
}

Result<CodeHash> parse_hash(const std::string& hex) {
    CodeHash h{};
    if (hex.size() != h.size() * 2)
        return fail(Errc::invalid_argument, fmt::format("a code hash is {} hex digits, '{}' has {}", h.size() * 2, hex, hex.size()));
    for (std::size_t i = 0; i < h.size(); ++i) {
        unsigned v = 0;
        for (char c : hex.substr(2 * i, 2)) {
            int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (d < 0) return fail(Errc::invalid_argument, fmt::format("'{}' is not a hex digit in code hash '{}'", c, hex));
            v = v * 16 + static_cast<unsigned>(d);
        }
        h[i] = static_cast<std::uint8_t>(v);
    }
    return h;
}

Result<json> do_ack(Client& client, const Target& t, wire::Type type, Bytes payload) {
    auto bytes = client.control(t, static_cast<std::uint8_t>(type), std::move(payload));
    if (!bytes) return tl::make_unexpected(bytes.error());
    auto msg = decode_reply(wire::Type::ack, *bytes);
    if (!msg) return tl::make_unexpected(msg.error());
    const auto& a = std::get<wire::Ack>(msg->body);
    return json{{"done", a.done}, {"note", std::string(a.note)}};
}

// xctl key ...: identities, no agent involved. Exit 0 on success, 1 on failure.
int key_generate(const Options& o) {
    auto id = Identity::generate(o.key_name);
    if (!id) {
        std::cerr << "xctl: " << id.error().describe() << "\n";
        return kExitFailed;
    }
    if (auto saved = id->save(o.key_file); !saved) {
        std::cerr << "xctl: " << saved.error().describe() << "\n";
        return kExitFailed;
    }
    std::cout << id->public_line() << "\n";
    std::cerr << fmt::format("xctl: secret key in {} (mode 0600), public key in {}.pub; fingerprint {}\n", o.key_file,
                             o.key_file, fingerprint(id->public_key()));
    return 0;
}

int key_public(const Options& o) {
    auto id = Identity::load(o.key_file);
    if (!id) {
        std::cerr << "xctl: " << id.error().describe() << "\n";
        return kExitFailed;
    }
    std::cout << id->public_line() << "\n";
    return 0;
}

// A public key line, a file of them (a .pub or an authorized keys file), or a secret key file.
int key_fingerprint(const Options& o) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(o.key_file, ec)) {
        auto key = parse_public_key(o.key_file);
        if (!key) {
            std::cerr << "xctl: '" << o.key_file << "' is neither a file nor a public key: " << key.error().message << "\n";
            return kExitFailed;
        }
        std::cout << fingerprint(key->key) << " " << key->name << "\n";
        return 0;
    }
    std::ifstream in(o.key_file);
    std::string line;
    int printed = 0;
    for (unsigned number = 1; std::getline(in, line); ++number) {
        auto first = line.find_first_not_of(" \t\r");
        if (first == std::string::npos || line[first] == '#') continue;
        if (line.compare(first, 15, "ed25519-secret ") == 0) { // a secret key file: its own checks
            auto id = Identity::load(o.key_file);
            if (!id) {
                std::cerr << "xctl: " << id.error().describe() << "\n";
                return kExitFailed;
            }
            std::cout << fingerprint(id->public_key()) << " " << id->name() << "\n";
            return 0;
        }
        auto key = parse_public_key(line);
        if (!key) {
            std::cerr << fmt::format("xctl: {} line {}: {}\n", o.key_file, number, key.error().message);
            return kExitFailed;
        }
        std::cout << fingerprint(key->key) << " " << key->name << "\n";
        ++printed;
    }
    if (printed == 0) {
        std::cerr << "xctl: " << o.key_file << " holds no key\n";
        return kExitFailed;
    }
    return 0;
}

// Text output: one block per agent, nested objects flattened to "a.b = value".
void print_text(const json& j, const std::string& prefix = "  ") {
    if (j.is_object()) {
        for (const auto& [k, v] : j.items()) {
            if (v.is_structured()) {
                std::cout << prefix << k << ":\n";
                print_text(v, prefix + "  ");
            } else {
                std::cout << prefix << k << " = " << (v.is_string() ? v.get<std::string>() : v.dump()) << "\n";
            }
        }
    } else if (j.is_array()) {
        for (const auto& v : j) {
            if (v.is_structured()) {
                std::cout << prefix << "-\n";
                print_text(v, prefix + "  ");
            } else {
                std::cout << prefix << "- " << v.dump() << "\n";
            }
        }
    }
}

int run(const Options& o, const Action& action) {
    std::vector<std::string> addresses;
    if (!o.peers_file.empty()) {
        auto peers = read_peers_file(o.peers_file);
        if (!peers) {
            std::cerr << "xctl: " << peers.error().describe() << "\n";
            return kExitUsage;
        }
        for (const auto& p : *peers) addresses.push_back(p.address);
    } else {
        addresses.push_back(o.agent);
    }
    ClientOptions co;
    co.transport = *parse_transport(o.transport);
    co.connect_timeout = std::chrono::milliseconds(o.timeout_ms);
    co.call_timeout = std::chrono::milliseconds(o.timeout_ms);
    co.loopback_only = o.loopback;
    co.identity = o.identity;
    auto client = Client::create(co);
    if (!client) {
        std::cerr << "xctl: " << client.error().describe() << "\n";
        return kExitFailed;
    }
    json all = json::array();
    int rc = 0;
    for (std::size_t i = 0; i < addresses.size(); ++i) {
        json one{{"agent", addresses[i]}};
        if (!o.peers_file.empty()) one["rank"] = i;
        auto t = client->connect(addresses[i]);
        auto r = t ? action(*client, *t) : Result<json>(tl::make_unexpected(t.error()));
        if (r) {
            one["ok"] = true;
            one.update(*r);
        } else {
            rc = kExitFailed;
            one["ok"] = false;
            one["error"] = {{"code", std::string(to_string(r.error().code))}, {"message", r.error().message}};
        }
        all.push_back(one);
    }
    if (o.json) {
        std::cout << all.dump(2) << "\n";
    } else {
        for (const auto& one : all) {
            std::cout << one["agent"].get<std::string>() << (one["ok"].get<bool>() ? "" : " FAILED") << "\n";
            json rest = one;
            rest.erase("agent");
            rest.erase("ok");
            print_text(rest);
        }
    }
    return rc;
}

} // namespace

int main(int argc, char** argv) {
    CLI::App app{"xctl: ask running bitship agents what they are and do, and tell them to evict code or drain.\n"
                 "Exit status: 0 every agent answered, 1 some failed (see its error), 2 bad usage."};
    app.set_version_flag("--version", "xctl 0.1.0");
    app.require_subcommand(1);
    Options o;
    auto* agent_opt = app.add_option("--agent", o.agent, "HOST:PORT of one agent")->envname("BITSHIP_AGENT");
    auto* peers_opt = app.add_option("--peers-file", o.peers_file, "every agent of this peers file (xagent --peers-file), in rank order")
                          ->envname("BITSHIP_PEERS_FILE");
    agent_opt->excludes(peers_opt);
    app.add_flag("--json", o.json, "print JSON: an array with one object per agent");
    app.add_option("--transport", o.transport, "tcp, shm or any")->check(CLI::IsMember({"tcp", "shm", "any"}))->capture_default_str();
    app.add_option("--timeout-ms", o.timeout_ms, "per connect and per request")->capture_default_str();
    app.add_flag("--loopback", o.loopback, "pin UCX to the loopback device");
    app.add_option("--identity", o.identity,
                   "secret key file to authenticate with, for agents started with --authorized-keys")
        ->envname("BITSHIP_IDENTITY");

    std::function<int()> key_action;
    auto* key = app.add_subcommand("key", "make and show identities (Ed25519 keys): no agent needed");
    key->require_subcommand(1);
    auto* generate = key->add_subcommand("generate", "write a new secret key to FILE (mode 0600) and its public line "
                                                     "to FILE.pub; print the public line (append it to an agent's "
                                                     "--authorized-keys)");
    generate->add_option("file", o.key_file, "where the secret key goes (never overwritten)")->required();
    generate->add_option("--name", o.key_name, "the name the public line carries (default: user@host)");
    generate->callback([&] { key_action = [&] { return key_generate(o); }; });
    auto* pub = key->add_subcommand("public", "print the public key line of secret key FILE");
    pub->add_option("file", o.key_file, "a secret key file")->required();
    pub->callback([&] { key_action = [&] { return key_public(o); }; });
    auto* fp = key->add_subcommand("fingerprint", "print SHA256:... of a key: a secret key file, a file of public "
                                                  "key lines (.pub, authorized keys), or a quoted public key line");
    fp->add_option("key", o.key_file, "FILE or 'ed25519 BASE64 NAME'")->required();
    fp->callback([&] { key_action = [&] { return key_fingerprint(o); }; });

    Action action;
    auto* ping = app.add_subcommand("ping", "round trips answered by the agent's progress thread");
    ping->add_option("--count", o.ping_count, "how many")->capture_default_str();
    ping->callback([&] { action = [&](Client& c, const Target& t) { return do_ping(c, t, o.ping_count); }; });
    app.add_subcommand("info", "triple, CPU, cores, NUMA, GPUs, LLVM, uptime, sandbox and trust modes")->callback([&] {
        action = do_info;
    });
    app.add_subcommand("stats", "per kernel (hash, entry) and per client: calls, errors by code, compile and run times, bytes")
        ->callback([&] { action = do_stats; });
    auto* cache = app.add_subcommand("cache", "the agent's code cache");
    cache->require_subcommand(1);
    cache->add_subcommand("list", "the hashes it holds, their size and use")->callback([&] { action = do_cache_list; });
    auto* evict = cache->add_subcommand("evict", "drop one hash (never code a running call uses)");
    evict->add_option("hash", o.hash, "the code hash, 64 hex digits")->required();
    evict->callback([&] {
        action = [&](Client& c, const Target& t) -> Result<json> {
            auto h = parse_hash(o.hash);
            if (!h) return tl::make_unexpected(h.error());
            auto m = wire::encode_cache_evict(0, *h);
            return do_ack(c, t, wire::Type::cache_evict, std::move(m.payload));
        };
    });
    app.add_subcommand("drain", "stop accepting calls, finish those in flight, exit")->callback([&] {
        action = [](Client& c, const Target& t) { return do_ack(c, t, wire::Type::drain, {}); };
    });
    CLI11_PARSE(app, argc, argv);
    if (key_action) return key_action();
    if (o.agent.empty() && o.peers_file.empty()) {
        std::cerr << "xctl: say which agents: --agent HOST:PORT or --peers-file PATH\n";
        return kExitUsage;
    }
    if (!o.hash.empty()) {
        if (auto h = parse_hash(o.hash); !h) {
            std::cerr << "xctl: " << h.error().message << "\n";
            return kExitUsage;
        }
    }
    spdlog::set_level(spdlog::level::err); // the client library's notices are not xctl's output
    return run(o, action);
}
