// Daemon: a real `ctrund` process on 127.0.0.1 with a free port.
#ifndef CTRUN_TESTS_SUPPORT_DAEMON_H_
#define CTRUN_TESTS_SUPPORT_DAEMON_H_

#include <memory>
#include <string>
#include <vector>

#include "rendezvous/client/client.h"
#include "tests/support/child_process.h"

namespace ctrun::testing {

// Paths of the binaries under test and of the source tree, set by CMake.
std::string CtrundPath();
std::string CtrunPath();
std::string TestAgentPath();
std::string WorkerProbePath();
std::string TrainPath();
// The fake libnvidia-ml (tests/support/fake_nvml.cc).
std::string FakeNvmlPath();
std::string SourceDir();

// Writes a fresh self-signed certificate for `ip` and its key (openssl),
// valid for a day. Fails the current test if openssl does.
void MakeSelfSignedCert(const std::string& ip, const std::string& cert,
                        const std::string& key);

class Daemon {
 public:
  // Starts ctrund --listen `listen` plus `extra_args`, with `env` added to
  // its environment, and waits for its "listening" line. Fails the current
  // test if it does not come.
  explicit Daemon(std::vector<std::string> extra_args = {},
                  const std::string& listen = "127.0.0.1:0",
                  std::vector<std::string> env = {});

  const std::string& endpoint() const { return endpoint_; }
  ChildProcess& process() { return *process_; }
  // A connection with `token` (none by default).
  Connection Connect(const std::string& token = "",
                     bool own_tcp_connection = false) const;

 private:
  std::unique_ptr<ChildProcess> process_;
  std::string endpoint_;
};

}  // namespace ctrun::testing

#endif  // CTRUN_TESTS_SUPPORT_DAEMON_H_
