// The planner with real agents: it plans and explains, runs what it planned, keeps its
// breakpoints across a restart while the link is the same and measures again when the link
// changes, sends fewer shipped calls to a busy agent than to an idle one, and flags an agent
// that stays slower than predicted (and does not refit its model to those late runs).

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <sys/types.h>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include <fmt/format.h>

#include <behaviour_kernels.hpp>
#include <bitship/client.hpp>

#include "chase_op.hpp"
#include "background_load.hpp"
#include "launcher.hpp"
#include "planner.hpp"

namespace planner_test_cpp {

using namespace bitship;
using bitship::launch::BackgroundLoad;
using namespace bitship::xrdma;
using namespace std::chrono_literals;
using launch::AgentProcess;

namespace {

constexpr std::uint64_t kNodes = 1 << 12;
constexpr Boundaries kDepths{1, 256};

std::vector<std::string> chase_region() { return {"--region", fmt::format("chase={}", kNodes * 16), "--workers", "1"}; }

/// A second client keeping the agent at `address` busy: its one worker running busy_count
/// kernels, two in flight, so one is always queued, each 4x the fetch `unloaded` estimates (at
/// least 50 ms, at most 2 s; busy_count steps about a nanosecond each). `steps`: their length.
std::unique_ptr<BackgroundLoad> keep_busy(Transport transport, const std::string& address, const Plan& unloaded,
                                          std::uint64_t* steps = nullptr) {
    const auto kernel_steps = static_cast<std::uint64_t>(std::clamp(4 * unloaded.estimate_of(Strategy::get), 50e6, 2e9));
    if (steps != nullptr) *steps = kernel_steps;
    ClientOptions load_options;
    load_options.transport = transport;
    load_options.loopback_only = true;
    load_options.call_timeout = 60s;
    auto load = std::make_unique<BackgroundLoad>(load_options, std::vector<std::string>{address}, 2,
                                                 [kernel_steps](Client& c, const Target& t) {
                                                     return c.ship(behaviour_kernels::busy_count, t, kernel_steps);
                                                 });
    REQUIRE(load->wait_for_calls(2, 30s));
    return load;
}

Client client_for(const std::string& transport) {
    ClientOptions o;
    o.transport = *parse_transport(transport);
    o.loopback_only = true;
    o.call_timeout = 60s;
    auto c = Client::create(o);
    REQUIRE(c);
    return std::move(*c);
}

PlannerOptions options_in(const std::filesystem::path& dir) {
    PlannerOptions o;
    o.wisdom = dir / "planner.wisdom";
    o.calibration_runs = 2;
    o.calibration_sizes = 4;
    // Never taken asleep: these tests weigh load, wisdom and lateness, and a test thread the
    // host runs late would find the agent idle past its spin window now and then, and plan()
    // and the run() after it differ. The sleeping owner has a test of its own.
    o.agent_spin = std::chrono::microseconds(0);
    return o;
}

/// One agent over TCP with the chase region and one worker, a client connected to it (check
/// `target`), and planner options that keep no wisdom file.
struct TcpChaseAgent {
    AgentProcess agent{"tcp", chase_region()};
    Client client = client_for("tcp");
    Result<Target> target = client.connect(agent.address());
    PlannerOptions options = [] {
        auto o = options_in({});
        o.wisdom.clear();
        return o;
    }();
};

/// Whether every thread of `pid` is stopped (state T or t in /proc/<pid>/task/*/stat).
bool all_threads_stopped(pid_t pid) {
    std::error_code ec;
    for (const auto& task : std::filesystem::directory_iterator(fmt::format("/proc/{}/task", pid), ec)) {
        std::ifstream in(task.path() / "stat");
        std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        // The state follows the command's closing parenthesis: "pid (comm) S ...".
        const auto close = stat.rfind(')');
        if (close == std::string::npos || close + 2 >= stat.size()) continue; // the thread has gone
        const char state = stat[close + 2];
        if (state != 'T' && state != 't') return false;
    }
    return !ec;
}

/// SIGSTOP, and back once every thread of `pid` has stopped; past `within`, SIGCONT and false.
/// kill() returns once the signal is queued: one thread takes it and then stops the others, and
/// the rest run on meanwhile (on this VM, a spinning thread for up to 4 ms after kill() returned,
/// idle host; time enough for the agent to serve a call).
bool stop_process(pid_t pid, std::chrono::milliseconds within = std::chrono::milliseconds(5000)) {
    ::kill(pid, SIGSTOP);
    const auto until = std::chrono::steady_clock::now() + within;
    while (!all_threads_stopped(pid))
        if (std::chrono::steady_clock::now() > until) {
            ::kill(pid, SIGCONT);
            return false;
        }
    return true;
}

/// Stops a process for `stopped` out of every `stopped + running` until it goes (SIGSTOP, then
/// SIGCONT): its host slowing it down without a word, no queue for it to report.
class Throttle {
public:
    Throttle(pid_t pid, std::chrono::nanoseconds stopped, std::chrono::nanoseconds running)
        : thread_([this, pid, stopped, running] {
              while (!stop_.load()) {
                  stop_process(pid);
                  std::this_thread::sleep_for(stopped);
                  ::kill(pid, SIGCONT);
                  std::this_thread::sleep_for(running);
              }
              ::kill(pid, SIGCONT);
          }) {}
    Throttle(const Throttle&) = delete;
    Throttle& operator=(const Throttle&) = delete;
    ~Throttle() {
        stop_ = true;
        thread_.join();
    }

private:
    std::atomic<bool> stop_{false};
    std::thread thread_;
};

} // namespace

TEST_CASE("plan explains every strategy's estimate and run follows it with the right answer", "[integration][serial]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    INFO(transport);
    const auto dir = launch::make_temp_dir("bitship-planner-");
    AgentProcess agent(transport, chase_region());
    auto client = client_for(transport);
    auto target = client.connect(agent.address());
    REQUIRE(target);
    auto planner = Planner::open(client, {*target}, options_in(dir));
    REQUIRE(planner);
    CHECK(planner->link().rtt_ns > 0);
    CHECK(planner->link().mapped == (transport == "shm"));
    auto op = ChaseOp::create(client, {*target}, kNodes, 11);
    REQUIRE(op);
    REQUIRE(planner->add(**op, kDepths));
    CHECK(planner->stats().calibrations == 1);
    for (std::uint64_t depth : {1u, 16u, 256u}) {
        auto plan = planner->plan(**op, depth);
        REQUIRE(plan);
        INFO(plan->reason);
        REQUIRE(plan->estimates.size() == 3);
        for (const auto& e : plan->estimates) {
            CHECK(e.ns > 0);
            CHECK_THAT(plan->reason, Catch::Contains(std::string(to_string(e.strategy)) + ":"));
        }
        // The choice is the cheapest estimate (no load here).
        for (const auto& e : plan->estimates) CHECK(plan->estimate_of(plan->choice) <= e.ns);
        CHECK_THAT(plan->reason, Catch::StartsWith(std::string(to_string(plan->choice)) + ": "));
        Strategy taken{};
        auto answer = planner->run(**op, depth, &taken);
        REQUIRE(answer);
        CHECK(*answer == (*op)->expected(depth));
        CHECK(taken == plan->choice);
    }
    // Over TCP a deep walk is never worth a network round trip per hop (over shared memory a
    // GET is a copy from mapped memory, and may well be).
    if (transport == "tcp") CHECK(planner->choose(**op, 256) != Strategy::get);
    // An op it was not given is an error, by code.
    auto other = ChaseOp::create(client, {*target}, kNodes, 12);
    REQUIRE(other);
    auto unknown = planner->plan(**other, 4);
    REQUIRE_FALSE(unknown);
    CHECK(unknown.error().code == Errc::invalid_argument);
    auto too_big = planner->add(**other, {1, (*other)->max_size() + 1});
    REQUIRE_FALSE(too_big);
    CHECK(too_big.error().code == Errc::out_of_bounds);
    std::filesystem::remove_all(dir);
}

TEST_CASE("an owner idle past its spin window is taken to be asleep: waking it is weighed against fetching", "[integration][serial]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    INFO(transport);
    AgentProcess agent(transport, chase_region()); // spin-then-block, xagent's default
    auto client = client_for(transport);
    auto target = client.connect(agent.address());
    REQUIRE(target);
    auto options = options_in({});
    options.wisdom.clear();
    // The probe measures the wake-up; the choice is checked with one far dearer than any run
    // here, and a spin window far longer than the test's own steps, so that neither the
    // machine's speed nor a late test thread decides it.
    options.agent_spin = 100ms;
    auto probed = Planner::open(client, {*target}, [&] {
        auto o = options;
        o.agent_spin = std::chrono::microseconds(0);
        return o;
    }());
    REQUIRE(probed);
    CHECK(probed->link().woken_pings == kWakePings);
    CHECK(probed->link().wake_ns >= 0);
    WARN(fmt::format("{}: round trip {:.1f} us, after {} us idle {:.1f} us more", transport, probed->link().rtt_ns / 1e3,
                     kWakeSpell.count(), probed->link().wake_ns / 1e3));
    options.wake_ns = 1e9; // 1 s
    auto planner = Planner::open(client, {*target}, options);
    REQUIRE(planner);
    auto op = ChaseOp::create(client, {*target}, kNodes, 11);
    REQUIRE(op);
    REQUIRE(planner->add(**op, {1, 4096}));
    const auto& bp = planner->entry(**op)->cached;
    const std::vector<std::uint64_t> depths{1, 16, 256, 4096};
    // Awake: a run just reached it (the calibration ends waiting for the agent's background
    // compile, long enough under a sanitizer for the agent to have gone to sleep). The
    // breakpoints, and no wake-up anywhere.
    REQUIRE(planner->run_as(**op, 1, Strategy::native));
    for (auto depth : depths) {
        auto plan = planner->plan(**op, depth);
        REQUIRE(plan);
        INFO(plan->reason);
        CHECK(plan->wake_ns == 0);
        CHECK(plan->choice == bp.at(depth));
    }
    // Left alone past the spin window: asleep.
    const auto before = planner->stats();
    std::this_thread::sleep_for(250ms);
    bool pushed = false;
    for (auto depth : depths) {
        auto plan = planner->plan(**op, depth);
        REQUIRE(plan);
        INFO(plan->reason);
        CHECK(plan->wake_ns == 1e9);
        for (const auto& e : plan->estimates) {
            // Over TCP the owner serves the GETs too: every strategy wakes it.
            const bool wakes = e.strategy != Strategy::get || transport == "tcp";
            CHECK((e.terms.find("waking the owner") != std::string::npos) == wakes);
            CHECK((e.ns >= 1e9) == wakes);
        }
        if (transport == "tcp") {
            CHECK(plan->choice == bp.at(depth));
        } else {
            // Over mapped memory a GET wakes nobody: fetching, whatever the breakpoints said.
            CHECK(plan->choice == Strategy::get);
            if (bp.at(depth) != Strategy::get) {
                pushed = true;
                CHECK_THAT(plan->reason, Catch::Contains("the owner is asleep"));
            }
        }
    }
    // A run by the breakpoints' remote choice wakes it; the planner counts it, and the owner
    // is awake for the next plan.
    if (transport == "tcp") {
        REQUIRE(bp.at(4096) != Strategy::get); // a round trip a hop is never the cheaper over TCP
        Strategy taken{};
        auto answer = planner->run(**op, 4096, &taken);
        REQUIRE(answer);
        CHECK(*answer == (*op)->expected(4096));
        CHECK(taken == bp.at(4096));
        CHECK(planner->stats().woke == before.woke + 1);
        CHECK(planner->stats().after_idle == before.after_idle + 1); // it taught nothing
        auto plan = planner->plan(**op, 4096);
        REQUIRE(plan);
        CHECK(plan->wake_ns == 0);
    } else if (pushed) {
        // The deepest walk the breakpoints ship: fetched instead, and the owner left asleep.
        auto depth = *std::find_if(depths.rbegin(), depths.rend(), [&](std::uint64_t d) { return bp.at(d) != Strategy::get; });
        Strategy taken{};
        auto answer = planner->run(**op, depth, &taken);
        REQUIRE(answer);
        CHECK(*answer == (*op)->expected(depth));
        CHECK(taken == Strategy::get);
        CHECK(planner->stats().let_sleep == before.let_sleep + 1);
        CHECK(planner->stats().woke == before.woke);
        CHECK(planner->stats().after_idle == before.after_idle + 1); // after 250 ms of the planner's own idle: not learnt
        auto plan = planner->plan(**op, depth);
        REQUIRE(plan);
        CHECK(plan->wake_ns == 1e9);
    } else {
        WARN("shm: GET was the breakpoints' choice at every depth here; no walk to push back");
    }
}

TEST_CASE("the wisdom file survives a restart, and is measured again when the link changes", "[integration][serial]") {
    // The agents spin: a progress thread found asleep answers a ping in about 0.45 ms here,
    // which would make the same link measure as a changed one (see the note on issue 6).
    auto spinning = [] {
        auto args = chase_region();
        args.insert(args.end(), {"--progress", "spin"});
        return args;
    };
    const auto dir = launch::make_temp_dir("bitship-planner-");
    // Latencies on a loaded 2-core host (and under ASan) wander up to 100× between probes (a
    // progress thread found asleep on either side): this test tolerates any ratio and changes
    // the link in kind, shared memory to TCP, which no tolerance lets pass (the drift fraction
    // itself is unit-tested).
    auto options = [&] {
        auto o = options_in(dir);
        o.drift = 1e9;
        return o;
    };
    std::uint16_t port = 0;
    Breakpoints kept;
    {
        AgentProcess agent("shm", spinning());
        port = agent.port();
        auto client = client_for("shm");
        auto target = client.connect(agent.address());
        REQUIRE(target);
        auto op = ChaseOp::create(client, {*target}, kNodes, 11);
        REQUIRE(op);
        {
            auto first = Planner::open(client, {*target}, options());
            REQUIRE(first);
            REQUIRE(first->add(**op, kDepths));
            CHECK(first->stats().calibrations == 1);
            kept = first->entry(**op)->cached;
        }
        REQUIRE(std::filesystem::exists(dir / "planner.wisdom"));
        // A new planner (a restarted program) plans from the file, measuring nothing.
        auto second = Planner::open(client, {*target}, options());
        REQUIRE(second);
        REQUIRE(second->add(**op, kDepths));
        INFO("drifted " << second->stats().drifted << "; rtt " << second->link().rtt_ns << " ns, GET " << second->link().get_ns
                        << " ns; kept: " << Wisdom::format("-", *second->entry(**op)));
        CHECK(second->stats().calibrations == 0);
        CHECK(second->stats().wisdom_hits == 1);
        CHECK(second->entry(**op)->cached == kept);
    }
    // The same peer, now over TCP: its round trip is many times what the wisdom was made on.
    AgentProcess agent("tcp", spinning(), port);
    auto client = client_for("tcp");
    auto target = client.connect(agent.address());
    REQUIRE(target);
    auto op = ChaseOp::create(client, {*target}, kNodes, 11);
    REQUIRE(op);
    auto third = Planner::open(client, {*target}, options());
    REQUIRE(third);
    REQUIRE(third->add(**op, kDepths));
    CHECK(third->stats().drifted == 1);
    CHECK(third->stats().calibrations == 1);
    std::filesystem::remove_all(dir);
}

namespace {
// The wisdom file's one entry, as Wisdom::format writes it (empty when there is none).
std::string wisdom_line(const std::filesystem::path& file, std::string* key = nullptr) {
    std::ifstream in(file);
    std::string line;
    std::getline(in, line); // the format line
    while (std::getline(in, line))
        if (auto parsed = Wisdom::parse(line)) {
            if (key) *key = parsed->first;
            return Wisdom::format(parsed->first, parsed->second);
        }
    return {};
}
} // namespace

TEST_CASE("what refits learn reaches the wisdom file by the planner's end, not a write after every refit", "[integration][serial]") {
    const auto dir = launch::make_temp_dir("bitship-planner-");
    const auto file = dir / "planner.wisdom";
    AgentProcess agent("shm", chase_region());
    auto client = client_for("shm");
    auto target = client.connect(agent.address());
    REQUIRE(target);
    auto op = ChaseOp::create(client, {*target}, kNodes, 11);
    REQUIRE(op);
    auto options = options_in(dir);
    options.refit_every = 4;
    // What is tested is when refits are written, not the owner's load: runs late by less than
    // this are no queue. The agent idled at calibration's end, and its first calls pay its
    // wake-up and its threads' moves off a shared core (50-170 µs, then 5-80, against 2-3
    // predicted over shared memory on the 2-core test VM): three such runs read as a queue,
    // the planner fetched for load_fresh and learnt nothing meanwhile (1 run in 10 failed).
    options.slow_factor = 100;
    std::string key, last, calibrated;
    {
        auto planner = Planner::open(client, {*target}, options);
        REQUIRE(planner);
        const auto added = std::chrono::steady_clock::now();
        REQUIRE(planner->add(**op, kDepths));
        calibrated = wisdom_line(file, &key);
        REQUIRE_FALSE(calibrated.empty()); // a calibration is written at once
        // Runs until 8 refits (32 runs that teach), 64 a round: only runs within 4x of the
        // estimate teach (kLearnLimit), and on a contended CI host one round of 64 over shared
        // memory (2-3 us predicted) had 4 such runs.
        for (int round = 0; round < 50 && planner->stats().refits < 8; ++round)
            for (std::uint64_t depth = 1; depth <= 64; ++depth) REQUIRE(planner->run(**op, depth));
        REQUIRE(planner->stats().refits >= 8);
        last = Wisdom::format(key, *planner->entry(**op));
        REQUIRE(last != calibrated); // the runs taught it something (else this test shows nothing)
        // Not written after each refit: the file still holds the calibration (checked only while
        // the planner's flush interval, 5 s, cannot have passed).
        if (std::chrono::steady_clock::now() - added < 4s) CHECK(wisdom_line(file) == calibrated);
    }
    // Written when the planner went: the entry as the last refit left it.
    CHECK(wisdom_line(file) == last);
    std::filesystem::remove_all(dir);
}

TEST_CASE("a busy agent gets fewer shipped calls than an idle one", "[integration][serial]") {
    // Over shared memory, where a GET reads the owner's memory and waits for nobody. Over TCP
    // UCX serves a GET in software on the busy owner's host, and on two loaded cores the walk's
    // 256 GETs took 250 ms against 51 ms for shipping behind the queue: the planner rightly
    // shipped 29 runs of 30 there, and pushed back once, as often as the idle agent's planner
    // beside the load did.
    AgentProcess idle("shm", chase_region()), busy("shm", chase_region());
    auto client = client_for("shm");
    auto idle_t = client.connect(idle.address());
    auto busy_t = client.connect(busy.address());
    REQUIRE(idle_t);
    REQUIRE(busy_t);
    auto options = options_in({});
    options.wisdom.clear();
    // Both measured while idle: the same model, the same breakpoints.
    auto idle_op = ChaseOp::create(client, {*idle_t}, kNodes, 11);
    auto busy_op = ChaseOp::create(client, {*busy_t}, kNodes, 11);
    REQUIRE(idle_op);
    REQUIRE(busy_op);
    auto to_idle = Planner::open(client, {*idle_t}, options);
    auto to_busy = Planner::open(client, {*busy_t}, options);
    REQUIRE(to_idle);
    REQUIRE(to_busy);
    REQUIRE(to_idle->add(**idle_op, kDepths));
    REQUIRE(to_busy->add(**busy_op, kDepths));
    // The deepest walk of the range: shipping wins there by orders of magnitude when idle.
    constexpr std::uint64_t kDepth = kDepths.max_size;
    constexpr int kRuns = 30;
    REQUIRE(to_idle->choose(**idle_op, kDepth) != Strategy::get);
    REQUIRE(to_busy->choose(**busy_op, kDepth) != Strategy::get);

    std::uint32_t most_busy = 0, most_queued = 0;
    auto shipped = [&](Planner& planner, Op& op) {
        std::uint64_t n = 0;
        for (int i = 0; i < kRuns; ++i) {
            Strategy taken{};
            auto r = planner.run(op, kDepth, &taken);
            REQUIRE(r);
            REQUIRE(*r == op.expected(kDepth));
            n += taken != Strategy::get;
            most_busy = std::max<std::uint32_t>(most_busy, client.load(*busy_t).busy);
            most_queued = std::max<std::uint32_t>(most_queued, client.load(*busy_t).queued);
        }
        return n;
    };
    // The idle agent's runs come first, on a host with nothing else to do. Run beside the load
    // below, they would share this host's two cores with a worker spinning on 50 ms kernels, and
    // a host too busy to run the idle agent promptly makes its runs late where GETs are not:
    // then fetching is the right choice (the planner's update_lateness), and a CI machine did
    // make it for a third of them. The load under test is the agent's own queue.
    // First a few unrecorded calls: the agent idle through the other's calibration has gone to
    // sleep, and waking it made the first two runs 5-40x late (these planners never take an
    // owner to be asleep), a queue to the planner.
    for (int i = 0; i < 3; ++i) REQUIRE((*idle_op)->start(Strategy::xrdma, kDepth).get());
    const auto idle_shipped = shipped(*to_idle, **idle_op);

    // A second client keeps the busy agent's one worker running kernels, two in flight, so one
    // is always queued: each 4x the fetch the planner estimates for the walk (at least 50 ms,
    // at most 2 s; busy_count steps about a nanosecond each). The queue then costs more than
    // the mapped fetch on any host.
    auto unloaded = to_busy->plan(**busy_op, kDepth);
    REQUIRE(unloaded);
    std::uint64_t kernel_steps = 0;
    auto load_ptr = keep_busy(Transport::shm, busy.address(), *unloaded, &kernel_steps);
    auto& load = *load_ptr;
    INFO("background kernels of " << kernel_steps << " steps; the walk's fetch estimated at "
                                  << unloaded->estimate_of(Strategy::get) / 1e6 << " ms");
    const auto busy_shipped = shipped(*to_busy, **busy_op);
    // The idle agent's planner is not run again beside the load (above: on 2 cores it pushed
    // back 28 runs of 30 then, as many as the busy one's).
    auto last = to_busy->plan(**busy_op, kDepth);
    REQUIRE(last);
    const auto load_now = client.load(*busy_t);
    INFO("the busy agent's last plan: " << last->reason << "; its load " << load_now.busy << " busy, " << load_now.queued
                                        << " queued; at most " << most_busy << " busy, " << most_queued << " queued");
    fmt::print("busy vs idle agent: shipped {} of {} to the idle one, {} to the busy one (pushed back {}, past late GETs {}); "
               "background calls {}\n",
               idle_shipped, kRuns, busy_shipped, to_busy->stats().pushed_back, to_busy->stats().past_late_gets, load.calls());
    // Unloaded here the idle agent got all 30, the busy one 2: its queue pushed the rest back,
    // and the 2 were the planner's retries. The idle agent's count is not held to 30: over
    // shared memory a shipped walk takes about 4 us, and a host busy with anything else makes
    // a few such runs late while the mapped GETs, run by this thread, are not; three late runs
    // push an idle agent's runs back too for load_fresh (a niced `yes` beside this test left
    // it 6 and 14 of 30).
    CHECK(busy_shipped < idle_shipped);
    CHECK(busy_shipped <= kRuns / 3);
    CHECK(to_busy->stats().pushed_back >= kRuns / 2);
}

TEST_CASE("a caller that ships to a busy owner less often than load_fresh still sees its queue, and retries less and less", "[integration][serial]") {
    // Over shared memory, where a GET reads the owner's memory and waits for nobody (over TCP the
    // busy owner serves GETs late too, and shipping is then rightly chosen: late_gets). Runs
    // 150 ms apart against a load_fresh of 100 ms: never three late runs within it. Counted
    // within load_fresh alone, the planner shipped every one into the queue; counted within
    // kLateHorizon (30 x load_fresh) it pushes back after three late ones, and each retry that
    // finds the queue still there doubles how long the next push-back holds.
    AgentProcess busy("shm", chase_region());
    auto client = client_for("shm");
    auto target = client.connect(busy.address());
    REQUIRE(target);
    auto options = options_in({});
    options.wisdom.clear();
    options.load_fresh = 100ms;
    auto op = ChaseOp::create(client, {*target}, kNodes, 11);
    REQUIRE(op);
    auto planner = Planner::open(client, {*target}, options);
    REQUIRE(planner);
    REQUIRE(planner->add(**op, kDepths));
    constexpr std::uint64_t kDepth = kDepths.max_size;
    REQUIRE(planner->choose(**op, kDepth) != Strategy::get);
    // A queue that costs more than fetching on any host, as in the test above.
    auto unloaded = planner->plan(**op, kDepth);
    REQUIRE(unloaded);
    auto load = keep_busy(Transport::shm, busy.address(), *unloaded);
    constexpr int kRuns = 14;
    std::string taken_in_turn;
    int shipped = 0;
    for (int i = 0; i < kRuns; ++i) {
        Strategy taken{};
        auto r = planner->run(**op, kDepth, &taken);
        REQUIRE(r);
        REQUIRE(*r == (*op)->expected(kDepth));
        shipped += taken != Strategy::get;
        taken_in_turn += taken == Strategy::get ? 'g' : 's';
        std::this_thread::sleep_for(150ms);
    }
    INFO("in turn (s: shipped, g: fetched): " << taken_in_turn << "; pushed back " << planner->stats().pushed_back
                                              << "; background calls " << load->calls());
    // Three late ones, the first retry after 100 ms, the next after 200, 400, 800: 6 of 14 shipped
    // here (ssssgsggsggggg). With late runs counted within load_fresh alone (kLateHorizon 1):
    // all 14, none pushed back.
    CHECK(planner->stats().pushed_back >= 4);
    CHECK(shipped <= kRuns - 4);
}

TEST_CASE("an agent persistently slower than predicted is flagged in stats, slow_agents() and the log, and its late runs do not refit the model", "[integration][serial]") {
    TcpChaseAgent setup;
    auto& [agent, client, target, options] = setup;
    REQUIRE(target);
    auto op = ChaseOp::create(client, {*target}, kNodes, 5);
    REQUIRE(op);
    // Refits after every 4 runs that teach the model: late runs, if they taught it, would refit
    // it several times over below.
    options.refit_every = 4;
    auto planner = Planner::open(client, {*target}, options);
    REQUIRE(planner);
    REQUIRE(planner->add(**op, kDepths)); // measured at full speed
    const auto unloaded_ns = [&] { return estimate_ns(planner->entry(**op)->model, Strategy::xrdma, (*op)->work(16), true); };
    const double before_ns = unloaded_ns();
    CHECK(planner->slow_agents().empty());
    CHECK(planner->stats().slow_flags == 0);

    // Then the agent's host slows it down and says nothing (no queue to report): the process is
    // stopped most of the time, for ten times what a run is predicted to take (2.5 ms at least),
    // so a run that starts while it is stopped mostly waits several predictions. The spell
    // scales with the prediction because a sanitizer build's runs take far longer than 2.5 ms /
    // 10. Runs start at random phases of the cycle: a fixed spacing after a run that ended just
    // after SIGCONT would start every run at the same place, possibly inside the running spell.
    const auto predicted = planner->plan(**op, 16);
    REQUIRE(predicted);
    const std::chrono::nanoseconds predicted_ns{static_cast<std::int64_t>(predicted->estimate_of(Strategy::xrdma))};
    const auto stopped = std::max<std::chrono::nanoseconds>(2500us, 10 * predicted_ns);
    const auto running = std::max<std::chrono::nanoseconds>(500us, predicted_ns);
    INFO("a run predicted to take " << predicted_ns.count() << " ns; the agent stopped " << stopped.count()
                                    << " ns of every " << (stopped + running).count());
    Throttle throttle(agent.pid(), stopped, running);
    std::mt19937 rng(7);
    std::uniform_int_distribution<std::int64_t> phase(0, (stopped + running).count());
    for (std::size_t i = 0; i < 2 * options.slow_window; ++i) {
        REQUIRE(planner->run_as(**op, 16, Strategy::xrdma));
        std::this_thread::sleep_for(std::chrono::nanoseconds(phase(rng)));
    }
    const auto slow = planner->slow_agents();
    REQUIRE(slow.size() == 1);
    CHECK(slow.front() == agent.address());
    CHECK(planner->stats().slow_flags == 1);
    // The model is still the agent's at full speed after more runs than a refit keeps samples
    // of (64): the runs made while their lateness said the owner was loaded did not teach it
    // (the first few, before the lateness showed, may have). Taught, they would be all a refit
    // sees, and it would fit their waits.
    for (int i = 0; i < 64; ++i) {
        REQUIRE(planner->run_as(**op, 16, Strategy::xrdma));
        std::this_thread::sleep_for(std::chrono::nanoseconds(phase(rng)));
    }
    INFO("xrdma at depth 16, the model's estimate: " << before_ns << " ns before the slowdown, " << unloaded_ns() << " ns after");
    CHECK(unloaded_ns() < 1.5 * before_ns);
}

}  // namespace planner_test_cpp

namespace planner_test_cpp {

TEST_CASE("runs far slower than the model estimates do not refit it, when GETs are as late as remote runs", "[integration][serial]") {
    // Over TCP a GET waits for the agent to progress it, so an agent its host stops now and
    // then makes GETs late as well as remote runs: the planner reads that as a queue only past
    // 4x (update_lateness), and below it, or with no load seen at all, its refits would fit
    // those runs without the learn limit.
    //
    // The fit weighs a run by 1/time^2, so a few runs far late hardly move it; what moves it is
    // a window of kept samples nearly all late by a few times, the limit's case (a busy row of
    // bench/planner). So, after 16 runs of each strategy unstopped (what the op costs here now),
    // 80 more of each for which the agent is stopped as the run starts, for 5x what the model
    // estimates the run at then (late ~6x: past the limit, near enough to pull a fit; without
    // the limit, both estimates ended past the 2x checked, GET's ~8x up, in 3 runs of 3). Back to back,
    // so the agent never sleeps between runs: a call that wakes it is late by the wake-up
    // alone, which under ASan on a contended CI host was within 4x.
    TcpChaseAgent setup;
    auto& [agent, client, target, options] = setup;
    REQUIRE(target);
    options.refit_every = 2;
    // What is tested is what the model learns from runs the planner takes as unloaded: no
    // slow flag, and no load either (a report or late runs older than this are stale at once),
    // so the learn limit alone keeps the late runs out.
    options.slow_factor = 1000;
    options.load_fresh = std::chrono::milliseconds(0);
    auto op = ChaseOp::create(client, {*target}, kNodes, 5);
    REQUIRE(op);
    auto planner = Planner::open(client, {*target}, options);
    REQUIRE(planner);
    REQUIRE(planner->add(**op, kDepths));
    constexpr std::uint64_t kDepth = 16;
    const auto estimate = [&](Strategy s) { return estimate_ns(planner->entry(**op)->model, s, (*op)->work(kDepth), true); };
    const double get_before = estimate(Strategy::get), xrdma_before = estimate(Strategy::xrdma);
    std::map<Strategy, std::vector<double>> unstopped, lateness;
    const pid_t pid = agent.pid();
    constexpr int kUnstoppedFirst = 32;
    // Far more than a refit keeps samples of (64), in turns.
    for (int i = 0; i < kUnstoppedFirst + 160; ++i) {
        const Strategy s = i % 2 == 0 ? Strategy::get : Strategy::xrdma;
        const bool stop = i >= kUnstoppedFirst;
        const double est = estimate(s);
        std::thread resume;
        std::atomic<bool> started{false};
        std::atomic<std::int64_t> start_ns{0};
        if (stop) {
            // The agent is stopped (all its threads: stop_process) before the run, and resumed
            // 5x the estimate after the run's start, by a thread that spins (a sleep of 80 us
            // overslept to 5x that on this VM). The start is read here, just before the run:
            // counted from when the thread woke, a test thread the contended host ran late
            // would start its run with less of the stop left. (Either way, or both, CI saw runs
            // stopped for 5x their estimate take 2.5x.)
            REQUIRE(stop_process(pid)); // within 5 s
            resume = std::thread([pid, &started, &start_ns, d = std::chrono::nanoseconds(static_cast<std::int64_t>(5 * est))] {
                while (!started.load()) {
                }
                const std::chrono::steady_clock::time_point until{std::chrono::nanoseconds(start_ns.load()) + d};
                while (std::chrono::steady_clock::now() < until) {
                }
                ::kill(pid, SIGCONT);
            });
            start_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
            started = true;
        }
        auto r = planner->run_as(**op, kDepth, s);
        if (resume.joinable()) resume.join();
        REQUIRE(r);
        const auto ns = static_cast<double>(r->second.count());
        if (stop) lateness[s].push_back(ns / est);
        else unstopped[s].push_back(ns);
    }
    auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v.empty() ? 0.0 : v[v.size() / 2];
    };
    const double get_unstopped = median(unstopped[Strategy::get]), xrdma_unstopped = median(unstopped[Strategy::xrdma]);
    const double get_lateness = median(lateness[Strategy::get]), xrdma_lateness = median(lateness[Strategy::xrdma]);
    INFO("at depth 16, the model's estimate before and after: get " << get_before << " -> " << estimate(Strategy::get)
                                                                       << " ns, xrdma " << xrdma_before << " -> "
                                                                       << estimate(Strategy::xrdma) << " ns");
    INFO("the first unstopped runs' median: get " << get_unstopped << " ns, xrdma " << xrdma_unstopped
                                                  << " ns; stopped runs late by (median, × the estimate then) get "
                                                  << get_lateness << ", xrdma " << xrdma_lateness);
    // The premise: the stopped runs were past the limit (each waited 5x its estimate).
    REQUIRE(get_lateness > 4);
    REQUIRE(xrdma_lateness > 4);
    CHECK(planner->stats().refits > 0); // the unstopped runs taught it
    // Within 2x of the calibration or of what the op costs here unstopped, whichever is more
    // (the host may be slower now than when it calibrated): not pulled up to the late runs.
    CHECK(estimate(Strategy::get) < 2 * std::max(get_before, get_unstopped));
    CHECK(estimate(Strategy::xrdma) < 2 * std::max(xrdma_before, xrdma_unstopped));
}

} // namespace planner_test_cpp
