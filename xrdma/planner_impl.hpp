#pragma once
// The planner's state, shared by the files that make up Planner::Impl:
//   planner.cpp              the run-time choice (breakpoints, the owner's load) and the wisdom
//   planner_calibration.cpp  measuring: the links, and every strategy across an op's range
//   planner_record.cpp       real runs: timed, and what they teach (lateness, refits, slow agents)
// Private to xrdma/: nothing outside the planner includes it.

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/coarse_clock.hpp"
#include "loaded_choice.hpp"
#include "planner.hpp"

namespace bitship::xrdma {

struct Planner::Impl {
    using Clock = std::chrono::steady_clock;

    struct OpState {
        Op* op = nullptr;
        std::string key;
        std::string label;
        Boundaries bounds;
        std::vector<Strategy> strategies; ///< the planner's that the op offers
        WisdomEntry entry;
        bool cached = false;
        std::array<std::vector<Sample>, kStrategies> samples; // calibration and real runs, newest last
        unsigned runs_since_refit = 0;
        /// Cached code, the owner asleep: the breakpoints with waking it (`asleep_wake_ns`) in
        /// every strategy that reaches it (recompute; not kept in wisdom). Empty: not worked out.
        Breakpoints asleep;
        double asleep_wake_ns = 0;
    };
    struct AgentRecord {
        RunningFigure ratio;     ///< actual ÷ predicted
        RunningFigure excess_ns; ///< actual − predicted, for runs sent while it reported a full house
        /// The latest runs (remote ones with cached code, and GETs): when, actual ÷ predicted,
        /// actual − predicted. A queue the agent cannot report (calls waiting in the transport
        /// while its one worker runs a long kernel) shows as remote runs late where GETs are not.
        struct Late {
            Clock::time_point at;
            double ratio, excess_ns;
        };
        std::deque<Late> recent, recent_gets;
        double late_ns = 0;            ///< what the recent remote runs say a call waits (update_lateness)
        double get_late = 1;           ///< meanwhile, the recent GETs' actual ÷ predicted (≥ 1)
        Clock::time_point late_until;  ///< until when both hold
        /// How long lateness holds after the latest late remote run (update_lateness): from
        /// load_fresh, doubled each time the first remote run after a hold (a retry) is late
        /// too, up to kLateHorizon × load_fresh; a retry on time ends it. Zero: load_fresh.
        Clock::duration hold{};
        Clock::time_point judged_newest; ///< the newest remote run update_lateness last judged
        bool flagged = false;
    };

    Client* client = nullptr;
    std::vector<Target> agents;
    PlannerOptions options;
    std::vector<LinkFigures> links; ///< by agent, as probed (the lowest latencies of every probe)
    LinkFigures link;               ///< what the models start from: the agents' mean
    int probes = 1;
    std::vector<RemoteRegion> probe_regions; ///< by agent
    std::optional<Wisdom> wisdom;
    bool wisdom_dirty = false;         ///< entries put since the file was last written
    Clock::time_point wisdom_saved{};  ///< when it was
    std::map<const Op*, OpState> ops;
    std::map<std::uint64_t, AgentRecord> records; // by Target::id()
    AgentRecord* owner_record = nullptr;           // records' entry for agents.front(), once it has one
    /// When a run of this planner (or its link probe) last reached the owner; with the client's
    /// latest reply from it (Client::load), what says whether the owner has gone to sleep.
    Clock::time_point owner_heard{};
    Clock::time_point last_run_end{}; ///< when this planner's latest run (of any strategy) ended
    PlannerStats stats;

    [[nodiscard]] const OpState* find(const Op& op) const {
        auto it = ops.find(&op);
        return it == ops.end() ? nullptr : &it->second;
    }
    OpState* find(const Op& op) {
        auto it = ops.find(&op);
        return it == ops.end() ? nullptr : &it->second;
    }
    ~Impl();

    // planner.cpp: the choice and the wisdom.
    [[nodiscard]] std::string agents_key() const;
    Result<CodeHash> code_hash(const Op& op) const;
    /// The owner's last reply to this client (Client::load): read once a choice, and handed to
    /// calls_ahead and wake_ns.
    [[nodiscard]] AgentLoad owner_reply() const { return client->load(agents.front()); }
    [[nodiscard]] std::uint32_t calls_ahead(const AgentLoad& reply, Clock::time_point now) const;
    [[nodiscard]] double queue_wait_ns(std::uint32_t ahead, Clock::time_point now) const;
    [[nodiscard]] OwnerLoad owner_load(const AgentLoad& reply, std::uint32_t ahead, Clock::time_point now) const;
    [[nodiscard]] OwnerLoad owner_load() const;
    [[nodiscard]] double wake_ns(const AgentLoad& reply, Clock::time_point now) const;
    /// What waking the owner costs: PlannerOptions::wake_ns, else the probes' figure.
    [[nodiscard]] double wake_cost_ns() const noexcept { return options.wake_ns >= 0 ? options.wake_ns : link.wake_ns; }
    [[nodiscard]] bool reaches_owner(Strategy s) const noexcept { return s != Strategy::get || !link.mapped; }
    [[nodiscard]] Strategy choose(const OpState& st, std::uint64_t size, OwnerLoad load, Shift* shift = nullptr) const;
    void recompute(OpState& st);
    void recompute_asleep(OpState& st);
    void keep(const OpState& st, bool now = true);
    void save_wisdom();

    // planner_calibration.cpp: measuring the links and the ops.
    Result<void> probe_all();
    static std::uint32_t lanes_of(const std::vector<Target>& agents);
    static LinkFigures combined(const std::vector<LinkFigures>& all);
    std::vector<std::uint64_t> compile_marks();
    std::map<std::string, std::uint64_t> counters(const Target& a);
    void await_tier_up(const std::vector<std::uint64_t>& marks);
    Result<void> evict_code(const Op& op);
    Result<void> calibrate(OpState& st);
    Result<void> time_across_range(OpState& st, const std::vector<std::uint64_t>& sizes);
    Result<void> calibrate_cold_walk(OpState& st, const std::vector<std::uint64_t>& sizes, Strategy shipped, bool first_was_one);

    // planner_record.cpp: real runs and what they teach.
    Result<std::pair<Bytes, std::chrono::nanoseconds>> timed(Op& op, std::uint64_t size, Strategy s, bool check);
    Result<std::pair<Bytes, std::chrono::nanoseconds>> run_recorded(OpState& st, std::uint64_t size, Strategy s, std::uint32_t ahead,
                                                                   double wait, double wake);
    void record(OpState& st, std::uint64_t size, Strategy s, bool cached_before, double wait, bool owner_full, bool woke, bool rested,
                double actual_ns);
    void learn(OpState& st, std::uint64_t size, Strategy s, bool cached_before, bool loaded, double actual_ns, double unloaded_ns);
    void update_lateness(AgentRecord& rec, Clock::time_point now) const;
    static void push_sample(std::vector<Sample>& v, Sample s);
};

} // namespace bitship::xrdma
