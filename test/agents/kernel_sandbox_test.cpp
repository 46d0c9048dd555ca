// KernelSandbox (agents/kernel_sandbox.*): what a worker readies before its first call.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <latch>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "kernel_sandbox.hpp"
#include "sandbox_arena.hpp"

namespace kernel_sandbox_test_cpp {

using bitship::Errc;
using namespace bitship::agent;

namespace {

bool resident(const void* p) {
    const auto page_bytes = static_cast<std::uintptr_t>(::getpagesize());
    auto* page = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(p) & ~(page_bytes - 1));
    unsigned char in = 0;
    if (::mincore(page, page_bytes, &in) != 0) return false;
    return (in & 1) != 0;
}

struct Seen {
    bool claimed = false;
    Errc error = Errc::internal;
    bool call_buffer = false;
    bool stack = false;
};

} // namespace

TEST_CASE("a worker readies its sandbox area before its first call: claimed, and the pages every call writes mapped",
          "[unit]") {
    SandboxConfig config;
    config.arena_log2 = 32;
    config.kernel_heap_mib = 4;
    config.max_args = 4096;
    config.threads = 2;
    auto box = KernelSandbox::create(config);
    REQUIRE(box);
    KernelSandbox& sandbox = **box;

    // Three threads alive at once (a joined thread's id may be reused, and areas go by id): the
    // first readies itself, the second claims its area only when asked, the third finds every
    // area taken.
    std::vector<Seen> seen(3);
    std::latch claimed(2); // the first two hold their areas
    std::latch release(1); // ... until all three have looked
    auto look = [&](std::size_t i, bool prepare) {
        if (prepare) sandbox.prepare_thread();
        auto area = sandbox.arena()->this_thread();
        seen[i].claimed = area.has_value();
        if (area) {
            seen[i].call_buffer = resident((*area)->call_buffer);
            seen[i].stack = resident((*area)->stack_top - 1);
        } else {
            seen[i].error = area.error().code;
        }
    };
    std::thread first([&] {
        look(0, true);
        claimed.count_down();
        release.wait();
    });
    std::thread second([&] {
        look(1, false);
        claimed.count_down();
        release.wait();
    });
    claimed.wait();
    std::thread third([&] { look(2, true); }); // every area taken: readying claims nothing, throws nothing
    third.join();
    release.count_down();
    first.join();
    second.join();

    CHECK(seen[0].claimed);
    CHECK(seen[0].call_buffer);
    CHECK(seen[0].stack);
    // Without prepare_thread the same pages are still untouched after the claim: the check can fail.
    CHECK(seen[1].claimed);
    CHECK_FALSE(seen[1].call_buffer);
    CHECK_FALSE(seen[1].stack);
    CHECK_FALSE(seen[2].claimed);
    CHECK(seen[2].error == Errc::too_large);
}

} // namespace kernel_sandbox_test_cpp
