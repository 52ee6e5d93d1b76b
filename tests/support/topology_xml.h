// A synthetic machine for --numa_binding tests, as hwloc XML (read through
// HWLOC_XMLFILE): 2 sockets, each one NUMA node with 2 last-level caches
// of 4 single-thread cores, and 4 NVIDIA GPUs. The CPU numbers interleave
// (socket 0 has the even ones, socket 1 the odd), so that on a machine
// with CPUs 0 and 1 each socket keeps one real CPU.
#ifndef CTRUN_TESTS_SUPPORT_TOPOLOGY_XML_H_
#define CTRUN_TESTS_SUPPORT_TOPOLOGY_XML_H_

#include <cstdio>
#include <string>

namespace ctrun::testing {

inline std::string Mask(unsigned bits) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", bits);
  return text;
}

// The sets every object of hwloc's XML carries.
inline std::string Sets(unsigned cpus, unsigned nodes) {
  return "cpuset=\"" + Mask(cpus) + "\" complete_cpuset=\"" + Mask(cpus) +
         "\" nodeset=\"" + Mask(nodes) + "\" complete_nodeset=\"" +
         Mask(nodes) + "\"";
}

inline std::string TwoSocketsEightGpusXml() {
  std::string xml =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n"
      "<topology version=\"2.0\">\n"
      "<object type=\"Machine\" os_index=\"0\" cpuset=\"0x0000ffff\" "
      "complete_cpuset=\"0x0000ffff\" allowed_cpuset=\"0x0000ffff\" "
      "nodeset=\"0x00000003\" complete_nodeset=\"0x00000003\" "
      "allowed_nodeset=\"0x00000003\">\n";
  for (int socket = 0; socket < 2; ++socket) {
    const unsigned socket_mask = socket == 0 ? 0x5555 : 0xaaaa;
    const unsigned nodes = 1u << socket;
    xml += "<object type=\"Package\" os_index=\"" + std::to_string(socket) +
           "\" " + Sets(socket_mask, nodes) +
           ">\n<object type=\"NUMANode\" os_index=\"" + std::to_string(socket) +
           "\" " + Sets(socket_mask, nodes) +
           " local_memory=\"1073741824\"/>\n";
    for (int cache = 0; cache < 2; ++cache) {
      unsigned cache_mask = 0;
      std::string cores;
      for (int c = 0; c < 4; ++c) {
        const int cpu = 2 * (cache * 4 + c) + socket;
        cache_mask |= 1u << cpu;
        const std::string i = std::to_string(cpu);
        cores += "<object type=\"Core\" os_index=\"" + i + "\" " +
                 Sets(1u << cpu, nodes) + "><object type=\"PU\" os_index=\"" +
                 i + "\" " + Sets(1u << cpu, nodes) + "/></object>\n";
      }
      xml += "<object type=\"L3Cache\" " + Sets(cache_mask, nodes) +
             " cache_size=\"33554432\" depth=\"3\" cache_linesize=\"64\" "
             "cache_associativity=\"0\" cache_type=\"0\">\n" +
             cores + "</object>\n";
    }
    for (int g = 0; g < 4; ++g) {
      char bus[8];
      std::snprintf(bus, sizeof bus, "%02x", 0x10 + 0x10 * (socket * 4 + g));
      xml += std::string(
                 "<object type=\"Bridge\" bridge_type=\"0-1\" "
                 "depth=\"0\" bridge_pci=\"0000:[") +
             bus + "-" + bus +
             "]\">\n<object type=\"PCIDev\" pci_busid=\"0000:" + bus +
             ":00.0\" pci_type=\"0302 [10de:2330] [10de:16c1] a1\"/>\n"
             "</object>\n";
    }
    xml += "</object>\n";
  }
  xml += "</object>\n</topology>\n";
  return xml;
}

}  // namespace ctrun::testing

#endif  // CTRUN_TESTS_SUPPORT_TOPOLOGY_XML_H_
