#include "tests/support/munged.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/time/clock.h"

namespace ctrun::testing {

Munged::Munged() {
  INFO("/usr/sbin/munged is missing: scripts/setup.sh installs munge");
  REQUIRE(access("/usr/sbin/munged", X_OK) == 0);
  std::string dir = "/tmp/ctrun-munge-XXXXXX";
  REQUIRE(mkdtemp(dir.data()) != nullptr);
  dir_ = dir;
  chmod(dir_.c_str(), 0755);
  socket_ = dir_ + "/munge.socket";
  const std::string key_path = dir_ + "/munge.key";
  {
    std::random_device random;
    std::string key(1024, '\0');
    for (char& c : key) c = static_cast<char>(random());
    std::ofstream(key_path, std::ios::binary) << key;
  }
  chmod(key_path.c_str(), 0400);
  process_ = std::make_unique<ChildProcess>(std::vector<std::string>{
      "/usr/sbin/munged", "--foreground", "--force", "--key-file", key_path,
      "--socket", socket_, "--pid-file", dir_ + "/munged.pid", "--log-file",
      dir_ + "/munged.log", "--seed-file", dir_ + "/munged.seed"});
  for (int i = 0; i < 100 && access(socket_.c_str(), F_OK) != 0; ++i)
    absl::SleepFor(absl::Milliseconds(50));
  std::stringstream log;
  log << std::ifstream(dir_ + "/munged.log").rdbuf();
  INFO("munged: " << process_->Stderr() << log.str());
  REQUIRE(access(socket_.c_str(), F_OK) == 0);
}

Munged::~Munged() {
  process_->Signal(SIGTERM);
  process_->Wait(absl::Seconds(5));
  process_.reset();  // SIGKILL if it has not ended
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

}  // namespace ctrun::testing
