// Slurm hostlists (launcher/options/slurm.h): any input is expanded or refused,
// never a crash; what expands re-expands to itself once joined by commas.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/str_join.h"
#include "launcher/options/slurm.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string list(reinterpret_cast<const char*>(data), size);
  auto hosts = ctrun::ExpandHostlist(list);
  if (!hosts.ok() || hosts->size() > 1000) return 0;
  for (const auto& h : *hosts) {
    // Expanded names are plain: no brackets or commas left in them.
    if (h.empty() || h.find_first_of("[],") != std::string::npos) std::abort();
  }
  auto again = ctrun::ExpandHostlist(absl::StrJoin(*hosts, ","));
  if (!again.ok() || *again != *hosts) std::abort();
  return 0;
}
