#include "ctrun/recovery.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "ctrun/environment.h"
#include "ctrun/gloo.h"
#include "progress_internal.h"

namespace ctrun {
namespace {

using progress_internal::MarkRound;
using progress_internal::RoundMark;

// The world file's keys (launcher/options/worker_env.h has the format).
constexpr char kRoundKey[] = "CTRUN_ROUND";
constexpr char kStateKey[] = "CTRUN_ROUND_STATE";
constexpr absl::Duration kPoll = absl::Milliseconds(5);

using World = std::map<std::string, std::string>;

std::optional<World> ReadWorld(const std::string& path, int64_t* round) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  World world;
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos)
      world[line.substr(0, eq)] = line.substr(eq + 1);
  }
  auto r = world.find(kRoundKey);
  auto s = world.find(kStateKey);
  if (r == world.end() || s == world.end() ||
      !absl::SimpleAtoi(r->second, round) ||
      (s->second != "ending" && s->second != "ready")) {
    return std::nullopt;
  }
  return world;
}

// The port in "HOST:PORT", or -1.
int PortOf(const std::string& endpoint) {
  int port = -1;
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(endpoint.substr(colon + 1), &port)) {
    return -1;
  }
  return port;
}

// Shuts down this process's connected TCP sockets but those to
// `keep_port` (the store): a Gloo collective waiting on a dead peer throws.
void SweepSockets(int keep_port) {
  std::set<std::string> inodes;
  for (const char* table : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::vector<std::string> f =
          absl::StrSplit(line, ' ', absl::SkipWhitespace());
      if (f.size() < 10 || f[3] != "01") continue;  // ESTABLISHED only
      const size_t colon = f[2].rfind(':');
      int port = -1;
      if (colon != std::string::npos) {
        port = static_cast<int>(
            std::strtol(f[2].substr(colon + 1).c_str(), nullptr, 16));
      }
      if (port != keep_port) inodes.insert(f[9]);
    }
  }
  std::error_code ec;
  for (const auto& entry :
       std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const std::string target =
        std::filesystem::read_symlink(entry.path(), ec).string();
    if (ec || !absl::StartsWith(target, "socket:[")) continue;
    if (!inodes.contains(target.substr(8, target.size() - 9))) continue;
    int fd = -1;
    if (absl::SimpleAtoi(entry.path().filename().string(), &fd)) {
      shutdown(fd, SHUT_RDWR);
    }
  }
}

}  // namespace

void WaitForSlot() {
  // What ctrun looks for in a program linked statically (its symbols may
  // be stripped): kept by the linker with this function.
  static const char* volatile kParks = "ctrun::WaitForSlot parks here";
  (void)kParks;
  const char* spare = std::getenv(env::kSpare);
  const char* path = std::getenv(env::kWorldFile);
  if (spare == nullptr || std::string(spare) != "1" || path == nullptr) return;
  for (int64_t round = 0;; absl::SleepFor(kPoll)) {
    std::optional<World> world = ReadWorld(path, &round);
    if (!world || world->at(kStateKey) != "ready") continue;
    for (const auto& [key, value] : *world) {
      if (!absl::StartsWith(key, "CTRUN_ROUND")) {
        setenv(key.c_str(), value.c_str(), 1);
      }
    }
    setenv(env::kSpare, "0", 1);
    MarkRound(RoundMark::kLeft, round);
    return;
  }
}

int Round() {
  int round = 0;
  for (const char* name : {env::kStoreRound, env::kRestartCount}) {
    const char* text = std::getenv(name);
    if (text != nullptr && absl::SimpleAtoi(text, &round)) return round;
  }
  return 0;
}

// Watches the world file from a thread of its own; see recovery.h.
class ResilientWorld::Watcher {
 public:
  Watcher(std::string path, int64_t round, int store_port)
      : path_(std::move(path)), round_(round), store_port_(store_port) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Watcher() {
    stop_.Notify();
    thread_.join();
  }

  // The main thread runs `round`'s collectives (or forms its context).
  void Enter(int64_t round) {
    std::lock_guard<std::mutex> lock(mu_);
    round_ = round;
    inside_ = true;
    released_ = false;
    ++entries_;
  }
  void Leave() {
    std::lock_guard<std::mutex> lock(mu_);
    inside_ = false;
  }

  // The next round's world: waits up to `grace` for the round to end, then
  // for the new world.
  absl::StatusOr<World> Next(absl::Duration grace) {
    std::unique_lock<std::mutex> lock(mu_);
    const auto until =
        std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(grace);
    if (!cv_.wait_until(lock, until, [&] { return latest_.has_value(); })) {
      return absl::NotFoundError(
          "no new round came: the failure is this worker's own");
    }
    // The agent bounds this wait (--recovery_timeout).
    cv_.wait(lock, [&] { return latest_->at(kStateKey) == "ready"; });
    World world = *std::exchange(latest_, std::nullopt);
    return world;
  }

 private:
  void Run() {
    std::tuple<ino_t, int64_t, off_t> stamp{};
    while (!stop_.WaitForNotificationWithTimeout(kPoll)) {
      struct stat st {};
      if (stat(path_.c_str(), &st) != 0) continue;
      const std::tuple<ino_t, int64_t, off_t> now{
          st.st_ino, st.st_mtim.tv_sec * 1'000'000'000LL + st.st_mtim.tv_nsec,
          st.st_size};
      if (now == stamp) continue;
      stamp = now;
      int64_t round = 0;
      std::optional<World> world = ReadWorld(path_, &round);
      if (!world) continue;
      std::lock_guard<std::mutex> lock(mu_);
      if (round < round_ ||
          (round == round_ && world->at(kStateKey) == "ready")) {
        continue;  // the round it runs in, or older
      }
      latest_ = std::move(world);
      cv_.notify_all();
      // Once per entry, and only while the main thread is still inside
      // (under the lock: it cannot leave and open new sockets meanwhile).
      if (inside_ && !released_) {
        released_ = true;
        SweepSockets(store_port_);
      }
    }
  }

  const std::string path_;
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t round_;  // guarded by mu_, as the rest
  bool inside_ = false;
  bool released_ = false;
  int64_t entries_ = 0;
  std::optional<World> latest_;
  const int store_port_;
  absl::Notification stop_;
  std::thread thread_;
};

ResilientWorld::ResilientWorld() = default;
ResilientWorld::~ResilientWorld() = default;

absl::StatusOr<std::unique_ptr<ResilientWorld>> ResilientWorld::Create() {
  auto identity = WorkerIdentity::FromEnvironment();
  if (!identity.ok()) return identity.status();
  std::unique_ptr<ResilientWorld> world(new ResilientWorld());
  world->identity_ = *identity;
  auto store = WorkerStore::Connect(world->identity_);
  if (!store.ok()) return store.status();
  world->store_ = std::move(*store);
  const char* recovery = std::getenv(env::kRecovery);
  const char* path = std::getenv(env::kWorldFile);
  if (recovery != nullptr && std::string(recovery) == "inprocess" &&
      path != nullptr) {
    world->watcher_ = std::make_unique<Watcher>(
        path, identity->store_round, PortOf(identity->store_endpoint));
    progress_internal::MarkResilient();
    MarkRound(RoundMark::kLeft, identity->store_round);
    world->watcher_->Enter(identity->store_round);
  }
  return world;
}

absl::Status ResilientWorld::NextRound(absl::Duration grace,
                                       const std::function<void()>& drop) {
  if (!watcher_) {
    return absl::FailedPreconditionError(
        "in-process recovery needs ctrun --recovery=inprocess");
  }
  watcher_->Leave();
  auto world = watcher_->Next(grace);
  if (!world.ok()) return world.status();
  for (const auto& [key, value] : *world) {
    if (!absl::StartsWith(key, kRoundKey))
      setenv(key.c_str(), value.c_str(), 1);
  }
  auto identity = WorkerIdentity::FromEnvironment();
  if (!identity.ok()) return identity.status();
  identity_ = *identity;
  MarkRound(RoundMark::kLeft, identity_.store_round);
  // The old round's communicator and store go first: they are broken.
  drop();
  store_.reset();
  auto store = WorkerStore::Connect(identity_);
  if (!store.ok()) return store.status();
  store_ = std::move(*store);
  // Forming the new communicator can be released too.
  watcher_->Enter(identity_.store_round);
  return absl::OkStatus();
}

void ResilientWorld::Formed() {
  MarkRound(RoundMark::kReady, identity_.store_round);
}

absl::StatusOr<std::unique_ptr<ResilientGloo>> ResilientGloo::Create(
    absl::Duration timeout) {
  auto world = ResilientWorld::Create();
  if (!world.ok()) return world.status();
  std::unique_ptr<ResilientGloo> comm(new ResilientGloo());
  comm->world_ = std::move(*world);
  comm->timeout_ = timeout;
  if (absl::Status s = comm->Form(); !s.ok()) return s;
  return comm;
}

absl::Status ResilientGloo::Form() {
  auto context =
      CreateGlooContext(world_->identity(), world_->store(), 0, timeout_);
  if (!context.ok()) return context.status();
  context_ = std::move(*context);
  world_->Formed();
  return absl::OkStatus();
}

absl::Status ResilientGloo::Reform(absl::Duration grace) {
  if (absl::Status s = world_->NextRound(grace, [&] { context_.reset(); });
      !s.ok()) {
    return s;
  }
  return Form();
}

#if defined(CTRUN_WITH_NCCL)
absl::StatusOr<std::unique_ptr<ResilientNccl>> ResilientNccl::Create(
    absl::Duration timeout) {
  auto world = ResilientWorld::Create();
  if (!world.ok()) return world.status();
  std::unique_ptr<ResilientNccl> comm(new ResilientNccl());
  comm->world_ = std::move(*world);
  comm->timeout_ = timeout;
  if (absl::Status s = comm->Form(); !s.ok()) return s;
  return comm;
}

absl::Status ResilientNccl::Form() {
  auto communicator =
      CreateNcclCommunicator(world_->identity(), world_->store(), 0, timeout_);
  if (!communicator.ok()) return communicator.status();
  communicator_ = std::move(*communicator);
  world_->Formed();
  return absl::OkStatus();
}

absl::Status ResilientNccl::Reform(absl::Duration grace) {
  // Destroying a communicator that saw an error aborts it (nccl.h).
  if (absl::Status s = world_->NextRound(grace, [&] { communicator_.reset(); });
      !s.ok()) {
    return s;
  }
  return Form();
}
#endif

}  // namespace ctrun
