// Which rank holds up a hung job, read from the stacks that the evidence
// of a hang keeps (EvidenceCollector): when every rank stalls in the same
// step, the heartbeats stop within milliseconds of each other and "which
// stopped first" names a rank by chance. The stacks say more: the ranks
// that wait inside a collective (torch.distributed, Gloo, NCCL) wait for
// the one whose main thread is somewhere else.
//
// Pure: text in, verdict out.
#ifndef CTRUN_LAUNCHER_POLICY_HANG_CULPRIT_H_
#define CTRUN_LAUNCHER_POLICY_HANG_CULPRIT_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace ctrun {

// Where one worker's main thread is, as its stacks show it.
struct StackReading {
  enum class Place {
    kUnknown,    // no stack, or no main thread found in it
    kWaiting,    // inside a collective or a store wait: it waits for others
    kElsewhere,  // anywhere else: what it runs may be what the others await
  };
  Place place = Place::kUnknown;
  // kWaiting: the collective ("all_reduce"); kElsewhere: its innermost frame
  // ("train.py, line 25, in step").
  std::string where;
  // "Python" or "native": which stack said it.
  std::string source;
};

// A faulthandler dump of every thread (the `rankR.python.txt` of the
// evidence). The main thread is the one whose outermost frame is a
// module's body; failing that, the thread the dump calls current.
StackReading ReadPythonStack(absl::string_view dump);

// gdb's `thread apply all bt` of process `pid` (`rankR.native.txt`); its
// main thread is the one whose LWP is `pid`.
StackReading ReadNativeStack(absl::string_view dump, pid_t pid);

// The Python reading when it says something, else the native one.
StackReading ReadStacks(absl::string_view python, absl::string_view native,
                        pid_t pid);

struct RankReading {
  int rank = 0;
  int local_rank = 0;
  StackReading reading;
};

struct HangVerdict {
  // Global ranks outside a collective while others wait in one; empty when
  // every rank read waits (what they wait for is not among them).
  std::vector<int> culprits;
  std::vector<int> waiting;
  // One line for the operator: who, where, and how it was decided.
  std::string line;
};

// A verdict when at least one of `ranks` waits in a collective; nullopt
// when none does (the stacks do not explain the hang).
std::optional<HangVerdict> JudgeHang(const std::vector<RankReading>& ranks);

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_POLICY_HANG_CULPRIT_H_
