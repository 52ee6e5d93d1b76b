#include "rendezvous/durable/state_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ctrun {
namespace {

absl::Status Errno(int error, absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(error, absl::StrCat("cannot ", what, " ", path));
}

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

class PosixStateFiles final : public StateFiles {
 public:
  ~PosixStateFiles() override {
    for (auto& [path, fd] : appending_) close(fd);
  }

  absl::StatusOr<std::string> Read(const std::string& path) override {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Errno(errno, "open", path);
    std::string bytes;
    char buffer[1 << 16];
    while (true) {
      const ssize_t n = read(fd, buffer, sizeof buffer);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int error = errno;
        close(fd);
        return Errno(error, "read", path);
      }
      if (n == 0) break;
      bytes.append(buffer, static_cast<size_t>(n));
    }
    close(fd);
    return bytes;
  }

  absl::Status Append(const std::string& path,
                      absl::string_view bytes) override {
    auto fd = AppendingFd(path);
    if (!fd.ok()) return fd.status();
    return WriteAll(*fd, bytes, path);
  }

  absl::Status Sync(const std::string& path) override {
    auto fd = AppendingFd(path);
    if (!fd.ok()) return fd.status();
    if (fdatasync(*fd) != 0) return Errno(errno, "sync", path);
    return absl::OkStatus();
  }

  absl::Status Truncate(const std::string& path, uint64_t size) override {
    if (truncate(path.c_str(), static_cast<off_t>(size)) != 0) {
      return Errno(errno, "truncate", path);
    }
    return absl::OkStatus();
  }

  absl::Status WriteSynced(const std::string& path,
                           absl::string_view bytes) override {
    Forget(path);
    const int fd =
        open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return Errno(errno, "create", path);
    absl::Status s = WriteAll(fd, bytes, path);
    if (s.ok() && fsync(fd) != 0) s = Errno(errno, "sync", path);
    close(fd);
    return s;
  }

  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (rename(from.c_str(), to.c_str()) != 0) {
      return Errno(errno, "rename", from);
    }
    // An open descriptor of `to` is of the file that was replaced.
    Forget(from);
    Forget(to);
    const std::string dir = DirectoryOf(to);
    const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd < 0) return Errno(errno, "open", dir);
    const bool synced = fsync(dir_fd) == 0;
    const int error = errno;
    close(dir_fd);
    if (!synced) return Errno(error, "sync", dir);
    return absl::OkStatus();
  }

  absl::Status Link(const std::string& from, const std::string& to) override {
    if (link(from.c_str(), to.c_str()) != 0) return Errno(errno, "link", to);
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<int> AppendingFd(const std::string& path) {
    if (auto it = appending_.find(path); it != appending_.end()) {
      return it->second;
    }
    const int fd =
        open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return Errno(errno, "open", path);
    appending_.emplace(path, fd);
    return fd;
  }

  void Forget(const std::string& path) {
    if (auto it = appending_.find(path); it != appending_.end()) {
      close(it->second);
      appending_.erase(it);
    }
  }

  static absl::Status WriteAll(int fd, absl::string_view bytes,
                               const std::string& path) {
    while (!bytes.empty()) {
      const ssize_t n = write(fd, bytes.data(), bytes.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Errno(errno, "write", path);
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return absl::OkStatus();
  }

  absl::flat_hash_map<std::string, int> appending_;
};

}  // namespace

std::unique_ptr<StateFiles> NewPosixStateFiles() {
  return std::make_unique<PosixStateFiles>();
}

FaultInjectingFiles::FaultInjectingFiles(std::unique_ptr<StateFiles> base)
    : base_(std::move(base)) {}

void FaultInjectingFiles::FailRandomly(double append, double sync,
                                       uint64_t seed) {
  append_p_ = append;
  sync_p_ = sync;
  random_.seed(seed);
}

bool FaultInjectingFiles::Chance(double p) {
  return p > 0 && std::uniform_real_distribution<double>(0, 1)(random_) < p;
}

absl::Status FaultInjectingFiles::DropUnsynced() {
  for (auto& [path, sizes] : sizes_) {
    if (sizes.written == sizes.synced) continue;
    if (auto s = base_->Truncate(path, sizes.synced); !s.ok()) return s;
    sizes.written = sizes.synced;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FaultInjectingFiles::Read(const std::string& path) {
  auto bytes = base_->Read(path);
  // What was there before this process is as good as synced.
  if (bytes.ok() && !sizes_.contains(path)) {
    sizes_[path] = {bytes->size(), bytes->size()};
  }
  return bytes;
}

absl::Status FaultInjectingFiles::Append(const std::string& path,
                                         absl::string_view bytes) {
  std::optional<size_t> cut = fail_append_after_;
  fail_append_after_.reset();
  if (!cut && Chance(append_p_)) {
    cut = std::uniform_int_distribution<size_t>(0, bytes.size())(random_);
  }
  Sizes& sizes = sizes_[path];
  if (cut) bytes = bytes.substr(0, std::min(*cut, bytes.size()));
  absl::Status s =
      bytes.empty() ? absl::OkStatus() : base_->Append(path, bytes);
  if (!s.ok()) return s;
  sizes.written += bytes.size();
  if (cut) {
    return absl::ErrnoToStatus(
        ENOSPC, absl::StrCat("cannot write ", path, " (injected fault)"));
  }
  return absl::OkStatus();
}

absl::Status FaultInjectingFiles::Sync(const std::string& path) {
  if (fail_sync_ || Chance(sync_p_)) {
    fail_sync_ = false;
    return absl::ErrnoToStatus(
        EIO, absl::StrCat("cannot sync ", path, " (injected fault)"));
  }
  if (auto s = base_->Sync(path); !s.ok()) return s;
  sizes_[path].synced = sizes_[path].written;
  return absl::OkStatus();
}

absl::Status FaultInjectingFiles::Truncate(const std::string& path,
                                           uint64_t size) {
  if (auto s = base_->Truncate(path, size); !s.ok()) return s;
  Sizes& sizes = sizes_[path];
  sizes.written = size;
  sizes.synced = std::min(sizes.synced, size);
  return absl::OkStatus();
}

absl::Status FaultInjectingFiles::WriteSynced(const std::string& path,
                                              absl::string_view bytes) {
  if (auto s = base_->WriteSynced(path, bytes); !s.ok()) return s;
  sizes_[path] = {bytes.size(), bytes.size()};
  return absl::OkStatus();
}

absl::Status FaultInjectingFiles::Rename(const std::string& from,
                                         const std::string& to) {
  if (auto s = base_->Rename(from, to); !s.ok()) return s;
  sizes_[to] = sizes_[from];
  sizes_.erase(from);
  return absl::OkStatus();
}

absl::Status FaultInjectingFiles::Link(const std::string& from,
                                       const std::string& to) {
  return base_->Link(from, to);
}

absl::StatusOr<std::unique_ptr<StateFiles>> StateFilesFromEnvironment() {
  const char* spec = std::getenv("CTRUND_JOURNAL_FAULTS");
  if (spec == nullptr || *spec == '\0') return NewPosixStateFiles();
  double append = 0, sync = 0;
  uint64_t seed = 1;
  for (absl::string_view part : absl::StrSplit(spec, ',')) {
    std::pair<std::string, std::string> kv = absl::StrSplit(part, '=');
    const bool ok = kv.first == "append" ? absl::SimpleAtod(kv.second, &append)
                    : kv.first == "sync" ? absl::SimpleAtod(kv.second, &sync)
                    : kv.first == "seed" ? absl::SimpleAtoi(kv.second, &seed)
                                         : false;
    if (!ok || append < 0 || append > 1 || sync < 0 || sync > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("CTRUND_JOURNAL_FAULTS='", spec,
                       "': expected append=P,sync=P,seed=N with P in [0, 1]"));
    }
  }
  auto files = std::make_unique<FaultInjectingFiles>(NewPosixStateFiles());
  files->FailRandomly(append, sync, seed);
  return files;
}

}  // namespace ctrun
