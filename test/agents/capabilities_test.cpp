// What an agent says about its machine in WELCOME (hwloc), as Client::connect returns it.

#include <catch2/catch.hpp>

#include <bitship/client.hpp>

#include "launcher.hpp"
#include "topology.hpp"

namespace capabilities_test_cpp {

using namespace bitship;
using bitship::launch::AgentProcess;
using namespace std::chrono_literals;

namespace {

AgentInfo connect_info(const AgentProcess& agent) {
    ClientOptions o;
    o.transport = Transport::tcp;
    o.loopback_only = true;
    auto client = Client::create(o);
    REQUIRE(client);
    auto t = client->connect(agent.address());
    INFO(agent.log());
    REQUIRE(t);
    return t->info();
}

} // namespace

TEST_CASE("connect returns the agent's capabilities: cores, threads, NUMA nodes and their memory, node kind, GPUs",
          "[integration]") {
    AgentProcess agent("tcp");
    auto info = connect_info(agent);
    const auto local = agent::detect_topology();
    CHECK(info.cores == local.cores);
    CHECK(info.capabilities.pus == local.caps.pus);
    CHECK(info.capabilities.pus >= info.cores);
    REQUIRE(info.capabilities.numa.size() == local.caps.numa.size());
    REQUIRE_FALSE(info.capabilities.numa.empty());
    CHECK(info.capabilities.numa[0].memory_bytes == local.caps.numa[0].memory_bytes);
    CHECK(info.capabilities.numa[0].memory_bytes > 0);
    CHECK(info.capabilities.cpu_model == local.caps.cpu_model);
    CHECK_FALSE(info.cpu.empty()); // the CPU LLVM tunes for
    // An x86-64 machine is a host, whatever PCI devices it has, and says why.
    CHECK(info.capabilities.kind == NodeKind::host);
    CHECK_FALSE(info.capabilities.kind_reason.empty());
    CHECK(info.capabilities.gpus == 0);
}

TEST_CASE("xagent --role dpu makes the agent a DPU in WELCOME, by the operator's word", "[integration]") {
    AgentProcess agent("tcp", {"--role", "dpu"});
    auto info = connect_info(agent);
    CHECK(info.capabilities.kind == NodeKind::dpu);
    CHECK(info.capabilities.kind_reason == "operator: xagent --role dpu");
    CHECK(std::string(to_string(info.capabilities.kind)) == "dpu");
}

TEST_CASE("BlueField's integrated NIC functions are known by their PCI ids, other devices are not", "[unit]") {
    CHECK(std::string(agent::bluefield_pci_id(0x15b3, 0xa2d6)->name) == "BlueField-2");
    CHECK(std::string(agent::bluefield_pci_id(0x15b3, 0xa2dc)->name) == "BlueField-3");
    CHECK(std::string(agent::bluefield_pci_id(0x15b3, 0xa2d2)->name) == "BlueField");
    CHECK_FALSE(agent::bluefield_pci_id(0x15b3, 0x101d)); // ConnectX-6 Dx, a plain NIC
    CHECK_FALSE(agent::bluefield_pci_id(0x8086, 0xa2d6)); // same device id, another vendor
}

}  // namespace capabilities_test_cpp
