// ctrun's command line: torchrun's flags, in both spellings
// (--nproc_per_node and --nproc-per-node), with their PET_<FLAG> environment
// overrides, parsed into LaunchOptions.
//
// Flags come before the entrypoint; everything after it belongs to the
// script, untouched, even when it looks like a ctrun flag. Every refusal is
// one line naming the flag and what it accepts.
#ifndef CTRUN_LAUNCHER_OPTIONS_COMMAND_LINE_H_
#define CTRUN_LAUNCHER_OPTIONS_COMMAND_LINE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/options/launch_options.h"

namespace ctrun {

using EnvMap = std::map<std::string, std::string>;

// What the machine has, for --nproc_per_node=gpu|cpu|auto.
struct HostFacts {
  std::string hostname;
  int cpu_count = 1;
  int gpu_count = 0;
  std::string gpu_source;  // how gpu_count was found, for messages
  int xpu_count = 0;       // Intel GPUs, for --nproc_per_node=xpu
  std::string xpu_source;
};

struct CommandLine {
  enum class Action { kLaunch, kHelp, kVersion, kStatus, kStatusHelp };
  Action action = Action::kLaunch;
  LaunchOptions options;
  bool json = false;  // `ctrun status --json`
  // `ctrun status` inside a multi-node Slurm allocation, with the rendezvous
  // Slurm's defaults make up: whichever step of the allocation trains, its
  // run id is not known here, so status shows every job the rendezvous holds.
  bool slurm_job = false;
};

// `args` excludes argv[0]. INVALID_ARGUMENT, with a one-line message, for
// anything that cannot be launched.
//
// `ctrun status [FLAGS] [--json]` (the first argument is `status`) asks the
// rendezvous of a running job about it: FLAGS are the launch's own, of which
// the rendezvous ones count (--rdzv_endpoint, --rdzv_id, --rdzv_conf, ...,
// or Slurm's defaults inside an allocation); it takes no program. A program
// named `status` still runs as `ctrun -- status` or `ctrun ./status`.
absl::StatusOr<CommandLine> ParseCommandLine(
    const std::vector<std::string>& args, const EnvMap& env,
    const HostFacts& host);

// The text of --help: a synopsis, then every flag.
std::string HelpText();
// The text of `ctrun status --help`.
std::string StatusHelpText();

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_OPTIONS_COMMAND_LINE_H_
