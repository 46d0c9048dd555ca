// What xagent does with a launcher's environment when it cannot join a PMIx job.

#include <catch2/catch.hpp>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "launcher.hpp"

namespace launch_env_test_cpp {

using bitship::launch::AgentProcess;

TEST_CASE("PMIX_NAMESPACE without a reachable PMIx server is a clear error at start, not a lone agent", "[integration]") {
    setenv("PMIX_NAMESPACE", "no-such-job", 1);
    std::string log;
    try {
        AgentProcess agent("tcp");
        log = "started: " + agent.log();
    } catch (const std::runtime_error& e) {
        log = e.what();
    }
    unsetenv("PMIX_NAMESPACE");
    INFO(log);
    CHECK_THAT(log, Catch::Contains("exited at start"));
    CHECK_THAT(log, Catch::Contains("PMIX_NAMESPACE is set"));
}

TEST_CASE("a launcher task count above 1 without PMIx warns and the agent runs alone", "[integration]") {
    setenv("SLURM_NTASKS", "4", 1);
    AgentProcess agent("tcp");
    unsetenv("SLURM_NTASKS");
    CHECK_THAT(agent.log(), Catch::Contains("4 tasks but there is no PMIx"));
    CHECK_THAT(agent.log(), Catch::Contains("srun without --mpi=pmix"));
}

}  // namespace launch_env_test_cpp
