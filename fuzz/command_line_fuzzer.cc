// ctrun's command line (launcher/options/command_line.h), --rdzv_conf and the
// Slurm and PET_* environment layers: any input parses or is refused with a
// message, never a crash. Input: one argument per line; after a line
// "--ENV--", one NAME=VALUE per line.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "launcher/options/command_line.h"
#include "launcher/options/launch_options.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> args;
  ctrun::EnvMap env;
  bool in_env = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line == "--ENV--") {
      in_env = true;
    } else if (!in_env) {
      args.emplace_back(line);
    } else if (size_t eq = line.find('='); eq != absl::string_view::npos) {
      const std::string name(line.substr(0, eq));
      // Keep the file system out: these name files ctrun reads.
      if (name == "SLURM_CONF") continue;
      env[name] = std::string(line.substr(eq + 1));
    }
  }
  env["SLURM_CONF"] = "/nonexistent/slurm.conf";
  const ctrun::HostFacts host{"fuzz-host", 4, 2, "fuzzing"};
  auto parsed = ctrun::ParseCommandLine(args, env, host);
  if (parsed.ok()) {
    // Whatever parses can be shown.
    (void)ctrun::FormatLaunchPlan(parsed->options, parsed->options.script_args);
  } else {
    // Every refusal says why, on one line.
    const auto message = parsed.status().message();
    if (message.empty() || message.find('\n') != absl::string_view::npos)
      std::abort();
  }
  return 0;
}
