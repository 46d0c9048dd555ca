// Shipped kernels cannot reach outside their sandbox (xagent --sandbox sfi, the default): each
// escape an authorized author could ship, run against a real agent with a canary page outside
// its arena. After each, the canary is intact and the agent answers the next call correctly.
// The same escapes against --sandbox none do change the canary: the check can fail.

#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <regex>
#include <string>

#include <bitship/client.hpp>
#include <bitship/kernel.h>
#include <behaviour_kernels.hpp>
#include <escape_kernels.hpp>

#include "core/memory_reuse.hpp"
#include "launcher.hpp"
#include "test_support.hpp"

namespace sandbox_test_cpp {

using namespace bitship;
using bitship::launch::AgentProcess;
using bitship::test::make_client;
using bitship::test::xctl_json;
using namespace std::chrono_literals;

namespace {

constexpr std::uint64_t kCanaryWord = 0xa5a5a5a5a5a5a5a5ull;

struct Sandboxed {
    explicit Sandboxed(std::vector<std::string> extra = {})
        : agent("tcp", with_canary(std::move(extra))), client(make_client("tcp")), target(connect(client, agent)),
          canary(canary_address()) {}
    static Target connect(Client& client, const AgentProcess& agent) {
        auto t = client.connect(agent.address());
        INFO(agent.log());
        REQUIRE(t);
        return *t;
    }
    static std::vector<std::string> with_canary(std::vector<std::string> extra) {
        extra.insert(extra.end(), {"--sandbox-canary", "--kernel-timeout-ms", "20000"});
        return extra;
    }
    std::string sandbox_info() { return xctl_json(agent, "info")["sandbox"].get<std::string>(); }
    std::uint64_t canary_address() {
        std::smatch m;
        auto info = sandbox_info();
        INFO(info);
        REQUIRE(std::regex_search(info, m, std::regex("canary (0x[0-9a-f]+) (intact|CHANGED)")));
        return std::stoull(m[1].str(), nullptr, 16);
    }
    bool canary_intact() { return sandbox_info().ends_with(" intact"); }
    /// The agent answers an honest call correctly, and its canary is untouched.
    void still_serves_and_intact() {
        auto r = client.ship(behaviour_kernels::add, target, std::uint64_t{20}, std::uint64_t{22}).get_as<std::uint64_t>();
        INFO(agent.log());
        REQUIRE(r);
        CHECK(*r == 42);
        CHECK(canary_intact());
    }

    AgentProcess agent;
    Client client;
    Target target;
    std::uint64_t canary = 0;
};

/// Contained: the access landed inside the arena (the call succeeded) or it faulted there.
void contained(const Result<std::vector<std::byte>>& r) {
    if (!r) CHECK(r.error().code == Errc::kernel_crashed);
}

std::size_t resident_bytes(pid_t pid) {
    std::ifstream statm("/proc/" + std::to_string(pid) + "/statm");
    std::size_t pages = 0, resident = 0;
    statm >> pages >> resident;
    return resident * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

} // namespace

TEST_CASE("WELCOME and INFO say which sandbox runs: sfi by default, none when asked", "[integration][sandbox]") {
    {
        Sandboxed box;
        CHECK(box.target.info().sandbox == SandboxMode::sfi);
        CHECK(box.sandbox_info().starts_with("sfi (arena 64 GiB at 0x"));
    }
    Sandboxed none({"--sandbox", "none"});
    CHECK(none.target.info().sandbox == SandboxMode::none);
    CHECK(none.sandbox_info().starts_with("none"));
}

TEST_CASE("a kernel's writes through a forged pointer stay inside the arena", "[integration][sandbox]") {
    Sandboxed box;
    contained(box.client.ship(escape_kernels::poke, box.target, box.canary, std::uint64_t{0}).get());
    box.still_serves_and_intact();
    // Through memcpy (a checked libc function): refused, naming the range, or kept inside.
    auto copied = box.client.ship(escape_kernels::copy_out, box.target, box.canary, std::uint64_t{4096}).get();
    if (!copied) {
        INFO(copied.error().describe());
        CHECK((copied.error().code == Errc::out_of_bounds || copied.error().code == Errc::kernel_crashed));
    }
    box.still_serves_and_intact();

    SECTION("the same write under --sandbox none does reach the canary (the check can fail)") {
        Sandboxed none({"--sandbox", "none"});
        auto r = none.client.ship(escape_kernels::poke, none.target, none.canary, std::uint64_t{0}).get();
        REQUIRE(r);
        CHECK_FALSE(none.canary_intact());
    }
}

TEST_CASE("a kernel cannot read agent memory outside the arena", "[integration][sandbox]") {
    Sandboxed box;
    auto peeked = box.client.ship(escape_kernels::peek, box.target, box.canary).get_as<std::uint64_t>();
    if (peeked) CHECK(*peeked != kCanaryWord);
    else CHECK(peeked.error().code == Errc::kernel_crashed);
    auto copied = box.client.ship(escape_kernels::copy_in, box.target, box.canary).get_as<std::uint64_t>();
    if (copied) CHECK(*copied != kCanaryWord);
    else CHECK((copied.error().code == Errc::kernel_crashed || copied.error().code == Errc::out_of_bounds));
    box.still_serves_and_intact();

    SECTION("under --sandbox none the same read sees the canary") {
        Sandboxed none({"--sandbox", "none"});
        auto r = none.client.ship(escape_kernels::peek, none.target, none.canary).get_as<std::uint64_t>();
        REQUIRE(r);
        CHECK(*r == kCanaryWord);
    }
}

TEST_CASE("pointers from another call and stale region pointers stay inside the arena", "[integration][sandbox]") {
    Sandboxed box({"--region", "scratch=4M"});
    auto kept = box.client.ship(escape_kernels::heap_pointer, box.target).get_as<std::uint64_t>();
    INFO(box.agent.log());
    REQUIRE(kept);
    contained(box.client.ship(escape_kernels::poke, box.target, *kept, std::uint64_t{7}).get());
    box.still_serves_and_intact();

    struct RegionAt {
        std::uint64_t base, size;
    };
    auto region = box.client.ship(escape_kernels::region_pointer, box.target).get_as<RegionAt>();
    REQUIRE(region);
    CHECK(region->size == 4u << 20);
    for (std::uint64_t past : {std::uint64_t{0}, std::uint64_t{4096}, std::uint64_t{1} << 30, std::uint64_t{1} << 40})
        contained(box.client.ship(escape_kernels::poke, box.target, region->base + region->size + past, std::uint64_t{9}).get());
    box.still_serves_and_intact();
}

TEST_CASE("runtime functions check the pointers and lengths kernels give them", "[integration][sandbox]") {
    Sandboxed box;
    // Past the agent's result limit: refused with BS_ETOOLARGE, which the kernel answers.
    auto overlong = box.client.ship(escape_kernels::overlong_reply, box.target, std::uint64_t{1} << 40).get_as<std::int64_t>();
    REQUIRE(overlong);
    CHECK(*overlong == BS_ETOOLARGE);
    // Within the limit but past the arena's end, from a stack array: stopped, naming bs_reply.
    auto past_end = box.client.ship(escape_kernels::reply_from, box.target, box.canary, std::uint64_t{64}).get();
    REQUIRE_FALSE(past_end);
    CHECK(past_end.error().code == Errc::out_of_bounds);
    CHECK_THAT(past_end.error().message, Catch::Contains("bs_reply"));
    auto len_out = box.client.ship(escape_kernels::args_len_to, box.target, box.canary).get();
    REQUIRE_FALSE(len_out);
    CHECK(len_out.error().code == Errc::out_of_bounds);
    CHECK_THAT(len_out.error().message, Catch::Contains("bs_args"));
    box.still_serves_and_intact();
}

TEST_CASE("an indirect call to a forged target is stopped before it is made", "[integration][sandbox]") {
    Sandboxed box;
    auto r = box.client.ship(escape_kernels::call_address, box.target, box.canary).get();
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::policy_violation);
    box.still_serves_and_intact();
}

TEST_CASE("stack exhaustion stops the kernel, not the agent", "[integration][sandbox]") {
    Sandboxed box;
    auto shallow = box.client.ship(escape_kernels::recurse, box.target, std::uint64_t{100}).get_as<std::uint64_t>();
    INFO(box.agent.log());
    REQUIRE(shallow);
    // Address-taken frames on the unsafe stack (8 MiB): a million KiB frames pass its limit.
    auto deep = box.client.ship(escape_kernels::recurse, box.target, std::uint64_t{1} << 20).get();
    REQUIRE_FALSE(deep);
    INFO(deep.error().describe());
    CHECK(deep.error().code == Errc::kernel_crashed);
    CHECK_THAT(deep.error().message, Catch::Contains("stack"));
    box.still_serves_and_intact();
    // Plain frames on the thread's own stack: its guard page.
    auto plain = box.client.ship(escape_kernels::recurse_plain, box.target, std::uint64_t{1} << 30).get();
    REQUIRE_FALSE(plain);
    CHECK(plain.error().code == Errc::kernel_crashed);
    box.still_serves_and_intact();
}

TEST_CASE("a call over its heap quota fails with a clear error, and bad frees are refused", "[integration][sandbox]") {
    Sandboxed box({"--kernel-heap-mib", "16"});
    auto fits = box.client.ship(escape_kernels::leak, box.target, std::uint64_t{8}).get();
    INFO(box.agent.log());
    REQUIRE(fits);
    auto over = box.client.ship(escape_kernels::leak, box.target, std::uint64_t{17}).get();
    REQUIRE_FALSE(over);
    CHECK(over.error().code == Errc::too_large);
    CHECK_THAT(over.error().message, Catch::Contains("quota of 16 MiB"));
    // The next call has its whole quota again.
    REQUIRE(box.client.ship(escape_kernels::leak, box.target, std::uint64_t{15}).get());
    auto freed = box.client.ship(escape_kernels::bad_free, box.target, box.canary).get();
    REQUIRE_FALSE(freed);
    CHECK(freed.error().code == Errc::out_of_bounds);
    box.still_serves_and_intact();
}

TEST_CASE("what calls leak is reclaimed: a thousand 1 MiB leaks leave resident memory where it was",
          "[integration][sandbox]") {
    Sandboxed box({"--workers", "1"});
    for (int i = 0; i < 10; ++i) REQUIRE(box.client.ship(escape_kernels::leak, box.target, std::uint64_t{1}).get());
    const auto before = resident_bytes(box.agent.pid());
    for (int i = 0; i < 1000; ++i) {
        auto r = box.client.ship(escape_kernels::leak, box.target, std::uint64_t{1}).get();
        INFO(i);
        REQUIRE(r);
    }
    const auto after = resident_bytes(box.agent.pid());
    INFO("resident before " << before / 1024 << " KiB, after " << after / 1024 << " KiB");
    // A thousand MiB leaked without reclaiming; the quota (64 MiB) bounds it with. Under a
    // sanitizer the allocator is ASan's, which holds freed blocks in quarantine: a thousand
    // calls' own small allocations then read as resident (12 MiB in one CI run).
    const std::size_t slack = malloc_is_tunable() ? (8u << 20) : (32u << 20);
    CHECK(after <= before + slack);
    box.still_serves_and_intact();
}

}  // namespace sandbox_test_cpp
