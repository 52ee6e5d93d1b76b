#include "tests/support/daemon.h"

#include <catch2/catch.hpp>

namespace ctrun::testing {

std::string CtrundPath() { return CTRUN_CTRUND_PATH; }
std::string CtrunPath() { return CTRUN_CTRUN_PATH; }
std::string TestAgentPath() { return CTRUN_TEST_AGENT_PATH; }
std::string WorkerProbePath() { return CTRUN_WORKER_PROBE_PATH; }
std::string TrainPath() { return CTRUN_TRAIN_PATH; }
std::string FakeNvmlPath() { return CTRUN_FAKE_NVML_PATH; }
std::string SourceDir() { return CTRUN_SOURCE_DIR; }

void MakeSelfSignedCert(const std::string& ip, const std::string& cert,
                        const std::string& key) {
  ChildProcess openssl({"/usr/bin/openssl", "req", "-x509", "-newkey",
                        "rsa:2048", "-nodes", "-days", "1", "-subj",
                        "/CN=ctrun-test", "-addext", "subjectAltName=IP:" + ip,
                        "-keyout", key, "-out", cert});
  REQUIRE(openssl.Wait(absl::Seconds(60)) == 0);
}

Daemon::Daemon(std::vector<std::string> extra_args, const std::string& listen,
               std::vector<std::string> env) {
  std::vector<std::string> argv = {CtrundPath(), "--listen", listen};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  process_ = std::make_unique<ChildProcess>(argv, std::move(env));
  auto line = process_->ReadLine(absl::Seconds(10));
  INFO("ctrund stderr: " << process_->Stderr());
  REQUIRE(line);
  const std::string prefix = "ctrund listening on ";
  REQUIRE(line->rfind(prefix, 0) == 0);
  endpoint_ = line->substr(prefix.size());
}

Connection Daemon::Connect(const std::string& token,
                           bool own_tcp_connection) const {
  ConnectionOptions options;
  options.endpoint = endpoint_;
  options.token = token;
  options.own_tcp_connection = own_tcp_connection;
  auto connection = Connection::Open(options);
  REQUIRE(connection.ok());
  return *connection;
}

}  // namespace ctrun::testing
