// One bundle, two architectures: x86-64 clients (this build) ship to an aarch64 xagent (the
// cross build, preset aarch64) run by qemu-user through binfmt_misc, over UCX TCP on loopback,
// with the real JIT on both sides. The emulated CPU is a Neoverse-N1 (QEMU_CPU).
//
// Every test first finds the aarch64 agent; where it is not built, or this kernel cannot run
// aarch64 binaries at all, the test exits with ctest's skip code (77) and says why.

#include <catch2/catch.hpp>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <thread>

#include <bitship/client.hpp>
#include <arch_kernels.hpp>
#include <x86_only_kernels.hpp>
#include <xrdma_kernels.hpp>

#include "arch_abi.h"
#include "chase.hpp"
#include "emulated_agent.hpp"
#include "launcher.hpp"

using namespace bitship;
using namespace std::chrono_literals;
using launch::AgentProcess;

namespace {

constexpr int kSkip = 77; // SKIP_RETURN_CODE in test/aarch64/CMakeLists.txt
constexpr const char* kEmulatedCpu = "neoverse-n1";
constexpr const char* kArmTriple = "aarch64-unknown-linux-gnu";
// qemu runs LLVM and kernels several times slower: a deadline no call should reach, not a
// timing expectation.
constexpr auto kCallTimeout = 120s;

const launch::AgentProgram& arm_agent() {
    static const auto found = launch::find_aarch64_agent(kEmulatedCpu);
    if (!found.program) {
        std::fprintf(stderr, "SKIPPED: %s\n", found.why_not.c_str());
        std::fflush(stderr);
        std::exit(kSkip);
    }
    return *found.program;
}

Client make_client() {
    ClientOptions o;
    o.transport = Transport::tcp;
    o.loopback_only = true;
    o.call_timeout = kCallTimeout;
    auto c = Client::create(o);
    REQUIRE(c);
    return std::move(*c);
}

Target connect(Client& client, const AgentProcess& agent) {
    auto t = client.connect(agent.address());
    INFO(agent.log());
    REQUIRE(t);
    return *t;
}

std::map<std::string, std::uint64_t> agent_counters(Client& client, const Target& t) {
    auto s = client.agent_stats(t);
    REQUIRE(s);
    return {s->begin(), s->end()};
}

Result<arch_reply> which_arch(Client& client, const Target& t, std::uint64_t a, std::uint64_t b) {
    return client.ship(arch_kernels::which_arch, t, a, b).get_as<arch_reply>();
}

std::uint64_t fnv1a(const Bytes& bytes) {
    std::uint64_t h = ARCH_FNV_OFFSET;
    for (auto b : bytes) h = (h ^ std::to_integer<std::uint8_t>(b)) * ARCH_FNV_PRIME;
    return h;
}

} // namespace

TEST_CASE("an x86-64 client ships a two-slice bundle to an aarch64 agent, which runs the aarch64 slice tuned for its own CPU",
          "[integration][aarch64]") {
    const auto& program = arm_agent();
    AgentProcess arm(program, "tcp");
    AgentProcess x86("tcp");
    auto client = make_client();
    auto arm_target = connect(client, arm);
    auto x86_target = connect(client, x86);

    // WELCOME: what the agent is, as LLVM and hwloc see it under qemu.
    const auto& info = arm_target.info();
    CHECK(normalise_triple(info.triple) == normalise_triple(kArmTriple));
    CHECK(info.cpu == kEmulatedCpu); // the CPU its JIT tunes for: the emulated one, not "generic"
    CHECK(info.cores >= 1);
    CHECK(info.capabilities.kind == NodeKind::host); // no BlueField here, no --role
    CHECK(info.capabilities.gpus == 0);
    CHECK_FALSE(info.capabilities.numa.empty());

    // The same kernel handle, the same bundle: each agent runs its own slice.
    const std::uint64_t a = 0x0123456789abcdefull, b = 77;
    auto on_arm = which_arch(client, arm_target, a, b);
    INFO(arm.log());
    REQUIRE(on_arm);
    CHECK(on_arm->arch == ARCH_AARCH64);
    CHECK(on_arm->pointer_bits == 64);
    CHECK(on_arm->value == arch_mix(a, b));
    auto on_x86 = which_arch(client, x86_target, a, b);
    REQUIRE(on_x86);
    CHECK(on_x86->arch == ARCH_X86_64);
    CHECK(on_x86->value == on_arm->value);

    // The agent compiled the aarch64 slice with its own CPU as target-cpu.
    CHECK_THAT(arm.log(), Catch::Contains(std::string("for ") + kArmTriple + " target-cpu=" + kEmulatedCpu));
    // It was sent its own slice alone (no peers: nothing forwards), not the whole bundle.
    auto counters = agent_counters(client, arm_target);
    CHECK(counters["code_received"] == 1);
    CHECK(counters["code_bytes_received"] < arch_kernels::bundle().size());
    CHECK(counters["compiles"] == 1);

    // Arguments small enough to go eager, and large enough for rendezvous.
    for (std::size_t size : {std::size_t{64}, std::size_t{512} << 10}) {
        Bytes big(size);
        std::mt19937_64 rng(size);
        for (auto& x : big) x = static_cast<std::byte>(rng());
        auto h = client.ship_bytes(arch_kernels::fnv1a, arm_target, big).get_as<std::uint64_t>();
        INFO(size << " bytes of arguments");
        REQUIRE(h);
        CHECK(*h == fnv1a(big));
    }
}

TEST_CASE("the aarch64 slice is built for the DPU class baseline, the x86-64 one for x86-64", "[unit][aarch64]") {
    // No agent needed: what bitship_add_kernels put in the bundle (cmake/BitshipKernels.cmake).
    auto view = BundleView::parse(arch_kernels::bundle());
    REQUIRE(view);
    auto arm = view->find_slice(kArmTriple);
    auto x86 = view->find_slice("x86_64-unknown-linux-gnu");
    REQUIRE(arm);
    REQUIRE(x86);
    CHECK(view->slices[*arm].cpu == "armv8.2-a+crypto");
    CHECK(view->slices[*x86].cpu == "x86-64");
    CHECK(view->slices[*arm].hash != view->slices[*x86].hash);
}

TEST_CASE("a restarted aarch64 agent gets its slice again through NEED_CODE, once", "[integration][aarch64]") {
    const auto& program = arm_agent();
    AgentProcess first(program, "tcp");
    auto port = first.port();
    auto client = make_client();
    auto target = connect(client, first);
    auto r = which_arch(client, target, 1, 2);
    INFO(first.log());
    REQUIRE(r);
    CHECK(r->arch == ARCH_AARCH64);
    first.stop(SIGKILL);

    AgentProcess second(program, "tcp", {}, port);
    // The first call after the restart may race the client noticing the old connection died:
    // it then fails with `disconnected`; the one after reconnects and succeeds.
    Result<arch_reply> again = fail(Errc::internal, "not run");
    for (int attempt = 0; attempt < 3; ++attempt) {
        again = which_arch(client, target, 20, 22);
        if (again || again.error().code != Errc::disconnected) break;
    }
    INFO(second.log());
    REQUIRE(again);
    CHECK(again->arch == ARCH_AARCH64);
    CHECK(again->value == arch_mix(20, 22));
    auto s = client.stats();
    CHECK(s.need_code_received == 1);
    CHECK(s.bundles_sent == 2);
    auto c = agent_counters(client, target);
    CHECK(c["need_code_sent"] == 1);
    CHECK(c["code_received"] == 1);
}

TEST_CASE("an x86-only bundle is refused by the aarch64 agent, naming both triples, and the agent goes on",
          "[integration][aarch64]") {
    const auto& program = arm_agent();
    AgentProcess arm(program, "tcp", {"--role", "dpu"});
    auto client = make_client();
    auto target = connect(client, arm);
    // The operator's word makes it a DPU in WELCOME.
    CHECK(target.info().capabilities.kind == NodeKind::dpu);
    CHECK_THAT(target.info().capabilities.kind_reason, Catch::Contains("--role dpu"));

    // The client sees it first...
    auto r = client.ship(x86_only_kernels::which_arch, target, std::uint64_t{1}, std::uint64_t{2}).get();
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::no_matching_slice);
    CHECK_THAT(r.error().message, Catch::Contains("x86_64") && Catch::Contains("aarch64"));
    // ... and the agent checks too, when a client sends the x86-64 slice anyway.
    Bytes args(sizeof(arch_args));
    auto forced = client.ship_slice(x86_only_kernels::bundle(), 0, "which_arch", target, args).get();
    INFO(arm.log());
    REQUIRE_FALSE(forced);
    CHECK(forced.error().code == Errc::no_matching_slice);
    CHECK_THAT(forced.error().message, Catch::Contains("x86_64-unknown-linux-gnu") && Catch::Contains(kArmTriple));
    CHECK(agent_counters(client, target)["compile_failures"] == 1);

    auto ok = which_arch(client, target, 5, 6);
    REQUIRE(ok);
    CHECK(ok->arch == ARCH_AARCH64);
}

TEST_CASE("a kernel forwards itself from an x86-64 agent to an aarch64 one, which runs its own slice, and "
          "without an aarch64 slice the caller hears why",
          "[integration][aarch64]") {
    const auto& program = arm_agent();
    AgentProcess x86("tcp");
    AgentProcess arm(program, "tcp");
    auto client = make_client();
    ShipOptions options;
    options.peers = {connect(client, x86), connect(client, arm)};
    const hop_args args{1, 0, 3, 4};

    // From an x86-64-only bundle: the first agent has no aarch64 slice to send on, and says so.
    // (First: the two bundles' x86-64 slices are the same bytes, the same hash, and an agent
    // that was once given the two-slice bundle would send on its aarch64 slice.)
    auto refused = client.ship(x86_only_kernels::hop_then_answer, options.peers[0], options, args).get();
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == Errc::no_matching_slice);
    CHECK_THAT(refused.error().message, Catch::Contains("x86_64") && Catch::Contains(kArmTriple));

    // From the two-slice bundle: the aarch64 agent gets and runs its own slice.
    auto r = client.ship(arch_kernels::hop_then_answer, options.peers[0], options, args).get_as<arch_reply>();
    INFO(x86.log() + "\n" + arm.log());
    REQUIRE(r);
    CHECK(r->arch == ARCH_AARCH64);
    CHECK(r->value == arch_mix(3, 4));
    CHECK(agent_counters(client, options.peers[0])["forwards"] == 2);
    CHECK(agent_counters(client, options.peers[1])["results"] == 1);
    CHECK(client.stats().stray_replies == 0);
}

TEST_CASE("an X-RDMA chase across an x86-64 and an aarch64 agent forwards between them and answers the caller once",
          "[integration][aarch64]") {
    constexpr std::uint64_t kNodesPerAgent = 1 << 10, kSeed = 2026, kDepth = 120;
    const auto& program = arm_agent();
    std::vector<std::unique_ptr<AgentProcess>> agents;
    agents.push_back(std::make_unique<AgentProcess>("tcp", std::vector<std::string>{"--region", "chase=1M"}));
    agents.push_back(std::make_unique<AgentProcess>(program, "tcp", std::vector<std::string>{"--region", "chase=1M"}));
    auto client = make_client();
    std::vector<Target> targets{connect(client, *agents[0]), connect(client, *agents[1])};
    REQUIRE(normalise_triple(targets[1].info().triple) == normalise_triple(kArmTriple));

    auto list = xrdma::ChaseList::make(2, kNodesPerAgent, kSeed);
    auto chase = xrdma::Chase::open(client, targets);
    REQUIRE(chase);
    REQUIRE(chase->load(list));
    for (unsigned first : {0u, 1u}) { // starting on the x86-64 agent, then on the aarch64 one
        auto start = xrdma::ChaseList::address_of(first, 5);
        auto got = chase->run(xrdma::Strategy::xrdma, start, kDepth);
        INFO("starting on agent " << first);
        INFO((got ? std::string() : got.error().describe() + "\nx86-64 agent:\n" + agents[0]->log() +
                                        "\naarch64 agent:\n" + agents[1]->log()));
        REQUIRE(got);
        auto want = list.walk(start, kDepth);
        CHECK(got->addr == want.addr);
        CHECK(got->sum == want.sum);
    }
    std::this_thread::sleep_for(500ms); // a duplicate answer would arrive by now
    CHECK(client.stats().stray_replies == 0);

    // Both agents forwarded to each other; each walk was answered by one agent only.
    std::uint64_t results = 0;
    for (unsigned a = 0; a < 2; ++a) {
        auto c = agent_counters(client, targets[a]);
        INFO("agent " << a);
        CHECK(c["forwards"] > 10); // random sharding: about half of the hops cross
        results += c["results"];
    }
    CHECK(results == 2);
    // The client sent the bundle once per first agent; the agents passed each other's slice on.
    CHECK(client.stats().bundles_sent == 2);
    CHECK(agent_counters(client, targets[1])["compile_failures"] == 0);
}
