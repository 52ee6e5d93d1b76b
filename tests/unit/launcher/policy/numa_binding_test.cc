// --numa_binding's plans on a synthetic machine (tests/support/
// topology_xml.h): 2 sockets of 8 cores in 2 core complexes, 4 GPUs each.
#include "launcher/policy/numa_binding.h"

#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "launcher/hw/topology.h"
#include "tests/support/topology_xml.h"

namespace ctrun {
namespace {

// The synthetic machine, read the way ctrun reads a real one.
const CpuTopology& Machine() {
  static const CpuTopology topology = [] {
    // One file per process: ctest runs each case as its own process, in
    // parallel, and hwloc silently reads the real machine when the file
    // is gone.
    const std::string path =
        std::filesystem::temp_directory_path() /
        ("ctrun-numa-test-" + std::to_string(getpid()) + ".xml");
    std::ofstream(path) << testing::TwoSocketsEightGpusXml();
    setenv("HWLOC_XMLFILE", path.c_str(), 1);
    auto t = LoadTopology();
    unsetenv("HWLOC_XMLFILE");
    std::filesystem::remove(path);
    REQUIRE(t.ok());
    // hwloc reads the real machine instead when it cannot read the file.
    REQUIRE(t->gpu_numa_nodes.size() == 8);
    return *t;
  }();
  return topology;
}

std::set<int> All() {
  std::set<int> cpus;
  for (int c = 0; c < 16; ++c) cpus.insert(c);
  return cpus;
}

std::string Plan(NumaPolicy policy, int gpu, std::set<int> allowed = All()) {
  auto b = PlanBinding(Machine(), policy, gpu, allowed);
  if (!b.ok()) return std::string(b.status().message());
  return CpuListString(b->cpus);
}

TEST_CASE("hwloc's topology gives each CPU its socket, node and cache",
          "[numa][unit]") {
  const CpuTopology& t = Machine();
  REQUIRE(t.cpus.size() == 16);
  CHECK(t.gpu_numa_nodes == std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1});
  for (const auto& cpu : t.cpus) {
    CHECK(cpu.socket == cpu.os_index % 2);
    CHECK(cpu.numa_node == cpu.os_index % 2);
  }
}

TEST_CASE("node binds to the GPU's NUMA node and prefers its memory",
          "[numa][unit]") {
  auto b = PlanBinding(Machine(), NumaPolicy::kNode, 5, All());
  REQUIRE(b.ok());
  CHECK(CpuListString(b->cpus) == "1,3,5,7,9,11,13,15");
  CHECK(b->memory_node == 1);
  CHECK(Plan(NumaPolicy::kNode, 0) == "0,2,4,6,8,10,12,14");
}

TEST_CASE("socket binds to every CPU of the GPU's socket", "[numa][unit]") {
  CHECK(Plan(NumaPolicy::kSocket, 3) == "0,2,4,6,8,10,12,14");
  auto b = PlanBinding(Machine(), NumaPolicy::kSocket, 3, All());
  CHECK(b->memory_node == -1);
}

TEST_CASE("exclusive splits a node's cores between its GPUs", "[numa][unit]") {
  CHECK(Plan(NumaPolicy::kExclusive, 0) == "0,2");
  CHECK(Plan(NumaPolicy::kExclusive, 1) == "4,6");
  CHECK(Plan(NumaPolicy::kExclusive, 3) == "12,14");
  CHECK(Plan(NumaPolicy::kExclusive, 4) == "1,3");
  // Seven usable cores for four GPUs: the first three get two.
  std::set<int> allowed = All();
  allowed.erase(14);
  CHECK(Plan(NumaPolicy::kExclusive, 2, allowed) == "8,10");
  CHECK(Plan(NumaPolicy::kExclusive, 3, allowed) == "12");
  CHECK(Plan(NumaPolicy::kExclusive, 0, {0, 1}) ==
        "NUMA node 0 has 1 usable physical cores for its 4 GPUs; "
        "--numa_binding=exclusive needs at least one each");
}

TEST_CASE("core-complex gives each GPU a last-level cache, round robin",
          "[numa][unit]") {
  CHECK(Plan(NumaPolicy::kCoreComplex, 0) == "0,2,4,6");
  CHECK(Plan(NumaPolicy::kCoreComplex, 1) == "8,10,12,14");
  CHECK(Plan(NumaPolicy::kCoreComplex, 2) == "0,2,4,6");
  CHECK(Plan(NumaPolicy::kCoreComplex, 5) == "9,11,13,15");
  // The fullest cache first.
  std::set<int> allowed = All();
  allowed.erase(0);
  CHECK(Plan(NumaPolicy::kCoreComplex, 0, allowed) == "8,10,12,14");
}

TEST_CASE("Only CPUs ctrun may use are bound, and none at all is an error",
          "[numa][unit]") {
  CHECK(Plan(NumaPolicy::kNode, 0, {0, 1}) == "0");
  CHECK(Plan(NumaPolicy::kNode, 4, {0, 1}) == "1");
  CHECK(Plan(NumaPolicy::kNode, 4, {0, 2}) ==
        "no CPU of GPU 4's NUMA node 1 is usable (ctrun may run on CPUs 0,2)");
  CHECK(Plan(NumaPolicy::kNode, 8) ==
        "GPU 8 is not in the machine's topology (hwloc found 8 NVIDIA GPUs)");
}

TEST_CASE("The policies are spelled as torchrun spells them", "[numa][unit]") {
  CHECK(*ParseNumaPolicy("core-complex") == NumaPolicy::kCoreComplex);
  CHECK(ParseNumaPolicy("numa").status().message() ==
        "expected node, socket, exclusive or core-complex");
}

}  // namespace
}  // namespace ctrun
