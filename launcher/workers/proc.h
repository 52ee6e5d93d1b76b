// What /proc says about other processes.
#ifndef CTRUN_LAUNCHER_WORKERS_PROC_H_
#define CTRUN_LAUNCHER_WORKERS_PROC_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ctrun {

// Up to `limit` bytes of the regular file `path` (a /proc file, or any
// other) from byte `from` on, or "" when it cannot be opened (its process
// is gone) or is not a regular file (a FIFO is never waited on). Never
// throws: a process that exits while std::ifstream reads its files makes
// the read fail with ESRCH, which libstdc++ throws.
std::string ReadProcFile(const std::string& path, size_t limit = 1 << 20,
                         off_t from = 0);

// The OOM kills the kernel has counted in this process's memory cgroup
// (cgroup v2's memory.events, or v1's memory.oom_control), which its
// workers share unless something moved them; nullopt where neither file
// says.
std::optional<uint64_t> CgroupOomKills();
// The N of the line "oom_kill N" in such a file's text.
std::optional<uint64_t> ParseOomKill(const std::string& text);

// The processes whose parent is `parent` now.
std::vector<pid_t> ChildrenOf(pid_t parent);

// Sends SIGKILL to every process (but this one) whose environment holds
// the entry `entry` ("NAME=VALUE") exactly; returns how many it found.
// Each process is held by a pidfd from before its environment is read
// until it is signalled, so one that ends meanwhile and whose pid goes to
// another process is never hit (by pid alone on kernels before 5.3). Only
// processes this one may read are seen.
int KillProcessesWithEnvironment(const std::string& entry);

// When process `pid` started, in clock ticks since boot (/proc/PID/stat's
// starttime): with the pid, it names one process even after the pid is
// reused. 0 when it is gone.
unsigned long long ProcessStartTime(pid_t pid);

// Whether a TCP socket of this network namespace listens on `port`, on
// any address (/proc/net/tcp and tcp6).
bool ListensOn(int port);

// How process `pid` stands, for an operator: "D (disk sleep) in
// WCHAN" from /proc/PID/status and /proc/PID/wchan; "gone" when it is.
std::string DescribeProcessState(pid_t pid);

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_WORKERS_PROC_H_
