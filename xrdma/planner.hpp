#pragma once
// The placement planner: for an operation over remote data, whether to move the data (RDMA
// GET, driven from here) or the compute (a native handler, or the shipped kernel), decided per
// call from measured figures, with the reason.
//
// A user declares each operation's boundaries (its size range); the planner measures the link
// (probe_link) and the operation by each strategy at a few sizes across the range, fits the
// cost model (cost_model.hpp), and works out the breakpoints: the sizes where the cheapest
// strategy changes. Those go in the wisdom file, so the next program run plans at once while
// the link measures the same. Choosing at run time is a lookup in a handful of sizes, plus
// one comparison when the owner is loaded (it last reported a queue, or its last remote runs
// were late): a loaded owner pushes work back to GET, unless its GETs are late as well and
// fetching costs more than its queue (loaded_choice.hpp).
//
// @code
//   auto planner = Planner::open(client, agents, {});          // each agent's link, probed
//   planner->add(chase, {1, 4096});                             // wisdom, or calibration
//   auto plan = planner->plan(chase, 1024);                     // choice + every estimate + reason
//   auto answer = planner->run(chase, 1024);                    // runs choose()'s pick, timed
// @endcode

#include <array>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <bitship/client.hpp>

#include "breakpoints.hpp"
#include "cost_model.hpp"
#include "op.hpp"
#include "running_figure.hpp"
#include "wisdom.hpp"

namespace bitship::xrdma {

/// The sizes an operation will be called with (in its own unit: Op::size_name()).
struct Boundaries {
    std::uint64_t min_size = 1;
    std::uint64_t max_size = 0;
};

struct PlannerOptions {
    /// Where breakpoints are kept across runs; empty: nowhere.
    std::filesystem::path wisdom = Wisdom::default_path();
    /// Kept wisdom is used while the link's round trip and GET latency measure within a factor
    /// 1 + drift of what it was computed from (either way); past it, the operation is measured
    /// again. Loopback figures wander by half between probes; TCP against shared memory is 10×.
    double drift = 1.0;
    /// The link probe's time at open().
    std::chrono::microseconds probe_budget{5000};
    /// A region every agent has, for the link probe's GETs (read only).
    std::string probe_region = "chase";
    /// What the planner may choose from (native needs the handler pre-installed at the agents);
    /// each operation is planned over those of them it offers (Op::offers).
    std::vector<Strategy> strategies{Strategy::get, Strategy::native, Strategy::xrdma, Strategy::reship};
    /// Calibration: sizes across the declared range, and timed runs at each.
    unsigned calibration_sizes = 8;
    unsigned calibration_runs = 5;
    /// Real runs between refits of the model from them (0: never refit). A refit's wisdom is
    /// written at most every 5 s and when the planner goes (a calibration's, at once).
    unsigned refit_every = 64;
    /// An agent whose runs take this many times their prediction (median over the window) is
    /// flagged as slow.
    double slow_factor = 1.5;
    std::size_t slow_window = 16;
    /// A reported queue older than this is stale, and late runs hold this long after the newest
    /// late one: the agent is taken as idle again (and, pushed back to GET, tried with shipping
    /// again; a retry that is late too doubles the hold, up to 30 × this). Late runs count
    /// while they are newer than 30 × this.
    std::chrono::milliseconds load_fresh{100};
    /// How long the agents spin before they sleep (xagent --spin-us; this is its default): an
    /// owner that long without a message from this client is taken to be asleep, and a remote
    /// run (or a GET walk where the owner serves GETs, TCP) pays for waking it once.
    /// 0: the owner is never taken to be asleep.
    std::chrono::microseconds agent_spin = kDefaultSpin;
    /// What waking a sleeping owner costs, ns; negative: what the link probes measured
    /// (LinkFigures::wake_ns, the agents' mean, after kWakeSpell of quiet: for agents that spin
    /// longer than that, give it here).
    double wake_ns = -1;
};

/// The planner's decision for one call, and why.
struct Plan {
    Strategy choice = Strategy::get;
    std::vector<Estimate> estimates; ///< every strategy it may choose from
    bool cached = false;             ///< the agents hold the shipped code
    double queue_wait_ns = 0;        ///< what the owner's reported queue adds to remote strategies
    double wake_ns = 0;              ///< what waking the sleeping owner adds to them (0: awake)
    std::optional<std::uint64_t> breakpoint; ///< the nearest size where the choice changes
    /// "xrdma: 31 µs est (cached; rtt 19 µs + 1024 × 12 ns) vs get: 12.3 ms est (1024 × 12 µs);
    /// breakpoint depth 2"
    std::string reason;
    [[nodiscard]] double estimate_of(Strategy s) const noexcept;
};

struct PlannerStats {
    std::uint64_t calibrations = 0; ///< operations measured (no wisdom, or the link drifted)
    std::uint64_t wisdom_hits = 0;  ///< operations planned from kept wisdom
    std::uint64_t drifted = 0;      ///< kept wisdom set aside because the link changed
    std::uint64_t refits = 0;
    std::uint64_t runs = 0;
    std::array<std::uint64_t, kStrategies> chosen{}; ///< by Strategy
    std::uint64_t pushed_back = 0;  ///< runs fetched because the owner's queue made shipping dearer
    std::uint64_t past_late_gets = 0; ///< runs sent to a loaded owner whose GETs were later than its queue
    std::uint64_t woke = 0;         ///< runs that found the owner asleep and woke it
    std::uint64_t let_sleep = 0;    ///< runs fetched because waking the owner made shipping dearer
    std::uint64_t after_idle = 0;   ///< runs not learnt: they woke the owner, or came after the planner sat idle
    std::uint64_t slow_flags = 0;   ///< times an agent was flagged as slow (slow_agents(), and a warning)
};

/// One thread at a time: run() and run_as() refit the models and update the records that
/// choose() and plan() read (the Client under it is thread-safe; a planner per thread is fine).
class Planner {
public:
    /// Probes the link to every agent (their mean is what every model starts from) and reads
    /// the wisdom file. `agents` is the peer table the operations run over; each needs the
    /// probe region.
    static Result<Planner> open(Client& client, std::vector<Target> agents, PlannerOptions options = {});
    Planner(Planner&&) noexcept;
    Planner& operator=(Planner&&) noexcept;
    ~Planner();

    /// Declares `op` and its size range: its breakpoints come from the wisdom file when an
    /// entry for it (this op, these agents, this code) was computed on a link that measures
    /// the same; otherwise it is measured by every strategy and the wisdom file updated.
    /// `label` names the op in the wisdom file and in logs (its parameters, say); default
    /// op.name(). `op` must outlive the planner.
    Result<void> add(Op& op, Boundaries boundaries, std::string label = {});

    /// The run-time choice: a breakpoint lookup, and where the owner is loaded or asleep a
    /// comparison with GET (with every strategy where the breakpoints chose GET and its GETs
    /// are late too).
    [[nodiscard]] Strategy choose(const Op& op, std::uint64_t size) const;
    /// choose(), with every strategy's estimate and the reason.
    [[nodiscard]] Result<Plan> plan(const Op& op, std::uint64_t size) const;
    /// Runs `op` at `size` by choose()'s strategy; the run's time refreshes the model and the
    /// agent's predicted-against-actual record. `chosen`, when given, receives the strategy.
    /// (plan() gives the same choice with its reason; run() does not format one.)
    Result<Bytes> run(Op& op, std::uint64_t size, Strategy* chosen = nullptr);
    /// Runs `op` by `strategy` regardless of the plan (the oracle's runs), timed and recorded
    /// as a real run. Returns the answer and the time.
    Result<std::pair<Bytes, std::chrono::nanoseconds>> run_as(Op& op, std::uint64_t size, Strategy strategy);

    /// The agents no longer hold `op`'s shipped code (evicted, restarted): plan as cold.
    void code_evicted(const Op& op);
    [[nodiscard]] bool code_cached(const Op& op) const;

    /// The link the models start from: the agents' mean.
    [[nodiscard]] const LinkFigures& link() const noexcept;
    /// Each agent's link as probed, in the order of `agents`.
    [[nodiscard]] const std::vector<LinkFigures>& links() const noexcept;
    [[nodiscard]] const WisdomEntry* entry(const Op& op) const;
    /// Agents whose runs have been persistently slower than predicted.
    [[nodiscard]] std::vector<std::string> slow_agents() const;
    [[nodiscard]] PlannerStats stats() const;

private:
    struct Impl;
    explicit Planner(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

} // namespace bitship::xrdma
