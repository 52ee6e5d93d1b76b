// The run directory: where one agent's per-attempt logs, error files and
// hang evidence go (--log_dir/RUN_ID_XXXXXX, or $TMPDIR/ctrun-XXXXXX).
#ifndef CTRUN_LAUNCHER_WORKERS_RUN_DIRECTORY_H_
#define CTRUN_LAUNCHER_WORKERS_RUN_DIRECTORY_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ctrun {

// $TMPDIR, or /tmp.
std::string TemporaryDirectory();

// The folder name that stands for job `run_id` under --log_dir: one path
// component whatever the id holds ('/' becomes '_', so "../x" or "a/b"
// cannot leave the log directory or make folders), at most 200 bytes (with
// mkdtemp's suffix it stays under NAME_MAX), never empty.
std::string RunFolderName(absl::string_view run_id);

// Creates this run's directory: `log_dir`/RunFolderName(run_id)_XXXXXX when
// `log_dir` is given (INVALID_ARGUMENT naming --log_dir when it cannot be),
// else $TMPDIR/ctrun-XXXXXX (INTERNAL when it cannot be).
absl::StatusOr<std::string> MakeRunDirectory(const std::string& log_dir,
                                             absl::string_view run_id);

// Marks temporary run directory `dir` as this process's: in
// `dir`/.ctrun/agent its pid, its start time and where that pid means
// something (this boot's id and this pid namespace). The agent removes
// .ctrun as it ends (and with it the mark), whether it then removes the run
// directory or keeps it for what it holds and says where; a mark outlives
// only an agent killed before it could clean up. While the agent lives it
// refreshes the mark's time (RefreshRunDirectoryMark) every
// kMarkRefreshInterval.
absl::Status MarkRunDirectory(const std::string& dir);
inline constexpr absl::Duration kMarkRefreshInterval = absl::Minutes(1);
void RefreshRunDirectoryMark(const std::string& dir);

// Where a pid names a process: this boot's id and this process's pid
// namespace, one word each ("BOOT PIDNS"). A temporary folder shared by
// containers, or by nodes (a TMPDIR on a shared file system), holds marks
// whose pids name processes elsewhere.
std::string PidScope();

// Writes `text` to `path` in a folder the workers may write too, replacing
// it whole: whatever stands at the temporary name `path`.new (a FIFO that
// would block the open for ever, a link to another file) is removed, the
// file is made afresh without following a link, then renamed over `path`.
// False when it could not be written.
bool ReplaceFile(const std::string& path, const std::string& text);

// A rendezvous an agent of this machine hosts for a --standalone job (or
// one without an endpoint), as `ctrun status` finds it: no flag names it.
struct NotedRendezvous {
  std::string endpoint;  // HOST:PORT on loopback
  std::string run_id;
  std::string token;   // admits to it; empty: it asks for none
  pid_t agent = 0;     // the agent that hosts it
  std::string folder;  // its run directory
};

// Notes `r` in temporary run directory `dir` (.ctrun/rendezvous, 0600, in
// the agent's own 0700 folder; gone with the mark as the agent ends).
absl::Status NoteRendezvous(const std::string& dir, const NotedRendezvous& r);

// The rendezvous noted in `tmp`'s ctrun-XXXXXX folders of this user whose
// mark names an agent that lives (this boot, this pid namespace, the same
// process), oldest agent first.
std::vector<NotedRendezvous> FindNotedRendezvous(const std::string& tmp);

// The ctrun-XXXXXX folders in `tmp` whose mark names an agent that is gone
// (no such process, or another one that took its pid) and was last
// refreshed at least `min_age` ago, removed whole. Only what this process
// can prove dead goes: a mark of another boot, host or pid namespace (or of
// an older ctrun, which said none) is never acted on. Folders without a
// mark (kept on purpose: an error file, hang evidence the agent pointed at)
// and folders of runs still going are never touched. Returns the folders
// removed.
std::vector<std::string> RemoveStaleRunDirectories(
    const std::string& tmp, absl::Duration min_age = absl::Minutes(5));

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_WORKERS_RUN_DIRECTORY_H_
