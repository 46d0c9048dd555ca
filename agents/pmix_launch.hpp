#pragma once
// Starting under a PMIx launcher (`mpirun -n N xagent`, `srun --mpi=pmix -n N xagent`): each
// agent publishes its address, one fence exchanges them, and every agent learns the whole
// ordered peer table and its own rank without --peer/--self.
//
//   auto job = PmixJob::init();                    // before any thread is started
//   if (!job) { error: launched by PMIx but it would not start }
//   if (*job) {                                    // nullptr: standalone (no PMIX_NAMESPACE)
//       auto table = (*job)->exchange(my_record);  // PMIx_Put + PMIx_Commit + PMIx_Fence
//       ...                                        // table->peers in rank order
//   }
//   // ~PmixJob runs PMIx_Finalize, on every path out.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <bitship/errc.hpp>
#include <bitship/peers.hpp>

namespace bitship::agent {

/// Whether this process was started by a PMIx launcher: PMIX_NAMESPACE is in its environment.
bool launched_by_pmix();

/// The task count a launcher announces without PMIx (SLURM_NTASKS, OMPI_COMM_WORLD_SIZE), or 0.
/// A count above 1 with no PMIx means `srun` without `--mpi=pmix`: each agent would run alone.
unsigned launcher_task_count();

/// This process's membership of a PMIx job. Only one exists per process.
class PmixJob {
public:
    /// Nothing (nullptr) when not launched by PMIx; an error when launched by PMIx and
    /// PMIx_Init fails. Call it with the stop signals already blocked: PMIx starts its own
    /// thread, which must inherit that mask.
    static Result<std::unique_ptr<PmixJob>> init();
    ~PmixJob(); ///< PMIx_Finalize
    PmixJob(const PmixJob&) = delete;
    PmixJob& operator=(const PmixJob&) = delete;

    [[nodiscard]] std::uint32_t rank() const noexcept { return rank_; }
    [[nodiscard]] std::uint32_t size() const noexcept { return size_; }
    [[nodiscard]] const std::string& nspace() const noexcept { return nspace_; }

    /// Publishes `mine` (PMIx_Put, PMIx_Commit), fences once collecting data, and reads every
    /// rank's record back: the job's peer table in rank order.
    Result<std::vector<PeerRecord>> exchange(const PeerRecord& mine);

    /// Calls `on_lost` (from PMIx's own thread: keep it async-signal-simple, e.g. raise a
    /// signal) when the launcher goes away (PMIX_ERR_LOST_CONNECTION, PMIX_ERR_UNREACH).
    Result<void> on_launcher_lost(std::function<void()> on_lost);

private:
    PmixJob() = default;
    std::string nspace_;
    std::uint32_t rank_ = 0;
    std::uint32_t size_ = 0;
};

} // namespace bitship::agent
