// bitcode_flips: ships byte-flipped, truncated and spliced bitcode slices, each with a valid
// hash, to a live xagent, and counts what the agent did with them: compiled and ran, refused
// (by which check), or — what must never happen — died or answered later than the call's
// deadline. Every input is wrapped in a proper bundle, so it passes the container's checks and
// reaches LLVM's bitcode reader. Exits 1 when the agent died or hung even once.
//
// The seeds are the bench kernels' x86_64 slices. The mutations, chosen at random per input:
//   flip     1 to 8 bytes XORed with a random non-zero value
//   truncate the bitcode cut at a random length
//   splice   the head of one seed joined to the tail of another, at random points
//
// The agent authorizes the client's key (launch::test_keys), so every input carries a valid
// signature from an authorized author and is judged by the compiler, not by the trust checks.

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <bench_kernels.hpp>
#include <bitship/bundle.hpp>
#include <bitship/client.hpp>
#include <jit_tiers_kernels.hpp>

#include "launcher.hpp"
#include "options.hpp"
#include "stats.hpp"

namespace {

using namespace bitship;
using Clock = std::chrono::steady_clock;

struct Seed {
    SliceInput slice;              // triple, cpu, producer, llvm; bitcode replaced per input
    std::vector<std::byte> bitcode;
    std::vector<std::string> entries;
};

std::vector<Seed> seeds() {
    std::vector<Seed> out;
    for (auto bundle : {bench_kernels::bundle(), jit_tiers_kernels::bundle()}) {
        auto view = BundleView::parse(bundle);
        if (!view) throw std::runtime_error(view.error().describe());
        for (const auto& s : view->slices) {
            if (normalise_triple(s.triple).find("x86_64") == std::string::npos) continue;
            Seed seed;
            seed.slice = SliceInput{s.triple, s.cpu, s.producer, s.llvm, {}};
            seed.bitcode.assign(s.bitcode.begin(), s.bitcode.end());
            seed.entries = view->entries;
            out.push_back(std::move(seed));
        }
    }
    if (out.empty()) throw std::runtime_error("no x86_64 seed slices");
    return out;
}

enum class Mutation { flip, truncate, splice };
const char* name(Mutation m) { return m == Mutation::flip ? "flip" : m == Mutation::truncate ? "truncate" : "splice"; }

std::vector<std::byte> mutate(const std::vector<Seed>& seeds, std::size_t pick, Mutation m, std::mt19937_64& rng) {
    const auto& a = seeds[pick].bitcode;
    auto below = [&](std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng() % n); };
    switch (m) {
    case Mutation::flip: {
        auto out = a;
        const std::size_t flips = 1 + below(8);
        for (std::size_t i = 0; i < flips; ++i) out[below(out.size())] ^= static_cast<std::byte>(1 + below(255));
        return out;
    }
    case Mutation::truncate: return {a.begin(), a.begin() + static_cast<std::ptrdiff_t>(below(a.size()))};
    case Mutation::splice: {
        const auto& b = seeds[below(seeds.size())].bitcode;
        std::vector<std::byte> out(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(below(a.size())));
        out.insert(out.end(), b.begin() + static_cast<std::ptrdiff_t>(below(b.size())), b.end());
        return out;
    }
    }
    return a;
}

/// What an answer says about the check that refused the input: the Errc, and for a policy
/// refusal its rule.
std::string outcome_of(const Result<Bytes>& r) {
    if (r) return "compiled and ran";
    const auto& e = r.error();
    std::string what{to_string(e.code)};
    if (e.code == Errc::compile_failed) {
        // Which of the compiler process's ends, or LLVM's own refusal.
        for (const char* cause : {"killed by SIGSEGV", "killed by SIGABRT", "killed by SIGBUS", "killed by SIGILL",
                                  "killed by seccomp", "CPU limit", "wall clock", "out of memory", "LLVM fatal error"})
            if (e.message.find(cause) != std::string::npos) return what + ": " + cause;
        return what + ": other";
    }
    if (e.code == Errc::invalid_bitcode)
        return what + (e.message.find("IR verifier") != std::string::npos ? ": IR verifier" : ": bitcode reader");
    if (e.code == Errc::policy_violation) {
        auto at = e.message.find("rule ");
        if (at != std::string::npos) what += " " + e.message.substr(at + 5, e.message.find(':', at) - at - 5);
    }
    return what;
}

bool alive(pid_t pid) {
    int status = 0;
    return ::waitpid(pid, &status, WNOHANG) == 0;
}

} // namespace

int main(int argc, char** argv) {
    bench::Options options{"bitcode_flips: mutated bitcode with valid hashes shipped to a live agent; counts deaths and hangs"};
    unsigned inputs = 100000;
    std::uint64_t seed = 1;
    unsigned deadline_ms = 5000;
    std::string transport = "tcp";
    std::string csv;
    std::vector<std::string> agent_args;
    options.add("--inputs", inputs, "mutated slices shipped");
    options.add("--seed", seed, "random seed (the run is reproducible)");
    options.add("--deadline-ms", deadline_ms, "each call's deadline; an answer later than this is a hang");
    options.add("--transport", transport, "tcp or shm").transport();
    options.add("--csv", csv, "write the counts here");
    options.add("--agent-arg", agent_args, "extra xagent argument (repeatable)");
    if (auto status = options.parse(argc, argv)) return *status;

    const auto all_seeds = seeds();
    fmt::print("bitcode_flips: {} | {} inputs, seed {}, {} seed slices, transport {}, call deadline {} ms | "
               "agent: 1 worker, --kernel-timeout-ms 1000, --cache-mib 64\n\n",
               bench::cpu_description(), inputs, seed, all_seeds.size(), transport, deadline_ms);

    std::vector<std::string> extra{"--workers", "1", "--kernel-timeout-ms", "1000", "--cache-mib", "64", "--log-level", "error"};
    extra.insert(extra.end(), agent_args.begin(), agent_args.end());
    std::map<std::string, std::uint64_t> outcomes;
    std::map<std::string, std::uint64_t> by_mutation;
    std::uint64_t deaths = 0, hangs = 0;
    std::vector<double> answer_ms;
    std::mt19937_64 rng(seed);
    const auto started = Clock::now();
    try {
        auto agent = std::make_unique<launch::AgentProcess>(transport, extra);
        ClientOptions o;
        o.transport = transport == "shm" ? Transport::shm : Transport::tcp;
        o.loopback_only = true;
        o.call_timeout = std::chrono::milliseconds(deadline_ms);
        auto client = Client::create(o);
        if (!client) throw std::runtime_error(client.error().describe());
        auto target = client->connect(agent->address());
        if (!target) throw std::runtime_error(target.error().describe());
        // Every input must reach the compiler: signed by a key the agent authorizes.
        if (target->info().access != AgentAccess::keys)
            throw std::runtime_error(fmt::format("the agent runs with access '{}', not 'keys'", to_string(target->info().access)));
        fmt::print("agent access: keys; every slice is signed by this client's authorized key\n");

        for (unsigned i = 0; i < inputs; ++i) {
            const std::size_t pick = rng() % all_seeds.size();
            const auto m = static_cast<Mutation>(rng() % 3);
            const Seed& s = all_seeds[pick];
            SliceInput input = s.slice;
            const auto bitcode = mutate(all_seeds, pick, m, rng);
            input.bitcode = bitcode;
            const auto bundle = write_bundle(s.entries, std::span(&input, 1));
            const std::string& entry = s.entries[rng() % s.entries.size()];
            Bytes args(64);

            const auto sent = Clock::now();
            auto r = client->ship_slice(bundle, 0, entry, *target, args).get();
            const double ms = std::chrono::duration<double, std::milli>(Clock::now() - sent).count();
            answer_ms.push_back(ms);
            ++by_mutation[name(m)];

            if (!alive(agent->pid())) {
                ++deaths;
                fmt::print("input {} ({}): the agent died\n{}\n", i, name(m), agent->log());
                agent = std::make_unique<launch::AgentProcess>(transport, extra);
                target = client->connect(agent->address());
                if (!target) throw std::runtime_error(target.error().describe());
                continue;
            }
            if (!r && r.error().code == Errc::timeout) {
                ++hangs;
                fmt::print("input {} ({}): no answer within {} ms ({})\n", i, name(m), deadline_ms, r.error().describe());
                continue;
            }
            if (!r && std::getenv("BITCODE_FLIPS_VERBOSE")) fmt::print("input {}: {}\n", i, r.error().describe());
            ++outcomes[outcome_of(r)];
            if ((i + 1) % 10000 == 0) fmt::print("  {} inputs, {} deaths, {} hangs\n", i + 1, deaths, hangs);
        }
        // The agent still answers a benign call correctly.
        auto ok = client->ship(bench_kernels::inc, *target, std::uint64_t{41}).get();
        std::uint64_t y = 0;
        if (!ok || ok->size() != 8 || (std::memcpy(&y, ok->data(), 8), y != 42))
            throw std::runtime_error("the agent no longer answers a benign call correctly");
        fmt::print("\nafter the run, a benign call: inc(41) = {}\n", y);
    } catch (const std::exception& e) {
        fmt::print(stderr, "bitcode_flips: {}\n", e.what());
        return 1;
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - started).count();

    fmt::print("\n{} inputs in {:.0f} s ({}): agent deaths {}, hangs past the deadline {}\n", inputs, seconds,
               fmt::format("flip {}, truncate {}, splice {}", by_mutation["flip"], by_mutation["truncate"],
                           by_mutation["splice"]),
               deaths, hangs);
    const auto st = bench::summarise(answer_ms);
    fmt::print("answer time per input: median {:.3f} ms, p99 {:.3f} ms, max {:.3f} ms\n\n", st.median, st.p99, st.max);
    fmt::print("{:>44} {:>10} {:>8}\n", "outcome (the check that decided)", "inputs", "share");
    std::vector<bench::Row> rows;
    for (const auto& [what, n] : outcomes) {
        fmt::print("{:>44} {:>10} {:>7.2f}%\n", what, n, 100.0 * double(n) / inputs);
        rows.push_back({{{"outcome", what}}, {}, {{"inputs", double(n)}}});
    }
    rows.push_back({{{"outcome", "agent death"}}, {}, {{"inputs", double(deaths)}}});
    rows.push_back({{{"outcome", "hang past deadline"}}, {}, {{"inputs", double(hangs)}}});
    if (!csv.empty()) bench::write_csv(csv, rows);
    return deaths == 0 && hangs == 0 ? 0 : 1;
}
