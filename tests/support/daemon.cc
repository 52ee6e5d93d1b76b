#include "tests/support/daemon.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>

namespace ctrun::testing {

namespace {

// The programs are where the build put them, unless CTRUN_TEST_BIN_DIR
// names a folder that holds them all: the GPU bundle runs its tests on
// another machine, from another path (scripts/gpu-bundle.sh).
std::string Program(const char* built) {
  const char* dir = getenv("CTRUN_TEST_BIN_DIR");
  if (dir == nullptr || *dir == '\0') return built;
  return std::string(dir) + "/" +
         std::filesystem::path(built).filename().string();
}

}  // namespace

std::string CtrundPath() { return Program(CTRUN_CTRUND_PATH); }
std::string CtrunPath() { return Program(CTRUN_CTRUN_PATH); }
std::string TestAgentPath() { return Program(CTRUN_TEST_AGENT_PATH); }
std::string WorkerProbePath() { return Program(CTRUN_WORKER_PROBE_PATH); }
std::string TrainPath() { return Program(CTRUN_TRAIN_PATH); }
std::string FakeNvmlPath() { return Program(CTRUN_FAKE_NVML_PATH); }
std::string SourceDir() {
  const char* dir = getenv("CTRUN_TEST_SOURCE_DIR");
  return dir != nullptr && *dir != '\0' ? dir : CTRUN_SOURCE_DIR;
}

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
  // Generous: under sanitizers, on two loaded cores, restoring a state dir
  // has taken more than 10 s.
  auto line = process_->ReadLine(absl::Seconds(30));
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
