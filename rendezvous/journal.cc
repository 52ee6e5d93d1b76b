#include "rendezvous/journal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ctrun {
namespace {

constexpr size_t kHeaderBytes = 8;
// A record larger than this is damage, not data: the biggest real one is a
// job of max nodes, or one key and value.
constexpr uint32_t kMaxRecordBytes = 64u << 20;
// Rewrite once this much was appended and it is more than the state.
constexpr uint64_t kRewriteAfterBytes = 64u << 20;

uint32_t Crc32(absl::string_view bytes) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char b : bytes) crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

void PutLittleEndian(uint32_t v, char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}

uint32_t GetLittleEndian(const char* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) {
    v |= static_cast<uint32_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  }
  return v;
}

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(errno, absl::StrCat(what, " ", path));
}

absl::Status WriteAll(int fd, absl::string_view bytes,
                      const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("cannot write", path);
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

void Apply(const v1::JournalRecord& record,
           std::map<std::string, JournaledJob>* jobs) {
  switch (record.kind_case()) {
    case v1::JournalRecord::kJob: {
      JournaledJob& job = (*jobs)[record.job().job_id()];
      // Each round has its own store.
      if (job.snapshot.round() != record.job().round()) job.keys.clear();
      job.snapshot = record.job();
      return;
    }
    case v1::JournalRecord::kForgetJob:
      jobs->erase(record.forget_job());
      return;
    case v1::JournalRecord::kPut: {
      auto it = jobs->find(record.put().job_id());
      if (it != jobs->end() &&
          it->second.snapshot.round() == record.put().round()) {
        it->second.keys[record.put().key()] = record.put().value();
      }
      return;
    }
    case v1::JournalRecord::kDelete: {
      auto it = jobs->find(record.delete_().job_id());
      if (it != jobs->end() &&
          it->second.snapshot.round() == record.delete_().round()) {
        it->second.keys.erase(record.delete_().key());
      }
      return;
    }
    case v1::JournalRecord::KIND_NOT_SET:
      return;
  }
}

// Reads up to the first damaged record; returns how many bytes were good.
size_t ReplayInto(absl::string_view bytes,
                  std::map<std::string, JournaledJob>* jobs) {
  size_t offset = 0;
  while (bytes.size() - offset >= kHeaderBytes) {
    const uint32_t length = GetLittleEndian(bytes.data() + offset);
    const uint32_t crc = GetLittleEndian(bytes.data() + offset + 4);
    if (length > kMaxRecordBytes ||
        bytes.size() - offset - kHeaderBytes < length) {
      break;
    }
    const absl::string_view body = bytes.substr(offset + kHeaderBytes, length);
    v1::JournalRecord record;
    if (Crc32(body) != crc ||
        !record.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
      break;
    }
    Apply(record, jobs);
    offset += kHeaderBytes + length;
  }
  return offset;
}

}  // namespace

std::string FrameRecord(const v1::JournalRecord& record) {
  std::string body = record.SerializeAsString();
  std::string framed(kHeaderBytes, '\0');
  PutLittleEndian(static_cast<uint32_t>(body.size()), framed.data());
  PutLittleEndian(Crc32(body), framed.data() + 4);
  framed += body;
  return framed;
}

std::map<std::string, JournaledJob> ReplayJournal(absl::string_view bytes,
                                                  size_t* dropped) {
  std::map<std::string, JournaledJob> jobs;
  *dropped = bytes.size() - ReplayInto(bytes, &jobs);
  return jobs;
}

Journal::Journal(std::string dir, int lock_fd)
    : dir_(std::move(dir)), lock_fd_(lock_fd) {}

Journal::~Journal() {
  if (fd_ >= 0) close(fd_);
  close(lock_fd_);  // releases the lock
}

absl::StatusOr<std::unique_ptr<Journal>> Journal::Open(
    const std::string& dir, std::map<std::string, JournaledJob>* jobs) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Errno("cannot create the state directory", dir);
  }
  const std::string lock_path = dir + "/lock";
  const int lock_fd =
      open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0) return Errno("cannot open", lock_path);
  if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    close(lock_fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "the state directory ", dir,
        " is in use by another ctrund; each daemon needs its own"));
  }
  std::unique_ptr<Journal> journal(new Journal(dir, lock_fd));

  const std::string path = dir + "/journal";
  journal->fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (journal->fd_ < 0) return Errno("cannot open", path);
  std::string bytes;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = read(journal->fd_, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("cannot read", path);
    if (n == 0) break;
    bytes.append(buffer, static_cast<size_t>(n));
  }
  jobs->clear();
  const size_t good = ReplayInto(bytes, jobs);
  // A record cut short by a crash is dropped, so that appends follow the
  // last whole one.
  if (ftruncate(journal->fd_, static_cast<off_t>(good)) != 0 ||
      lseek(journal->fd_, 0, SEEK_END) < 0) {
    return Errno("cannot truncate", path);
  }
  journal->base_bytes_ = good;
  return journal;
}

absl::Status Journal::Append(const v1::JournalRecord& record, bool sync) {
  const std::string framed = FrameRecord(record);
  const std::string path = dir_ + "/journal";
  if (auto s = WriteAll(fd_, framed, path); !s.ok()) return s;
  appended_bytes_ += framed.size();
  if (sync && fdatasync(fd_) != 0) return Errno("cannot sync", path);
  return absl::OkStatus();
}

absl::Status Journal::Rewrite(const std::vector<v1::JournalRecord>& records) {
  const std::string path = dir_ + "/journal";
  const std::string next = path + ".next";
  const int fd =
      open(next.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("cannot create", next);
  std::string bytes;
  for (const auto& record : records) bytes += FrameRecord(record);
  absl::Status s = WriteAll(fd, bytes, next);
  if (s.ok() && fsync(fd) != 0) s = Errno("cannot sync", next);
  if (s.ok() && rename(next.c_str(), path.c_str()) != 0) {
    s = Errno("cannot rename", next);
  }
  if (!s.ok()) {
    close(fd);
    unlink(next.c_str());
    return s;
  }
  // The rename itself must reach the disk.
  if (const int dir_fd = open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      dir_fd >= 0) {
    fsync(dir_fd);
    close(dir_fd);
  }
  close(fd_);
  fd_ = open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd_ < 0) return Errno("cannot reopen", path);
  close(fd);
  base_bytes_ = bytes.size();
  appended_bytes_ = 0;
  return absl::OkStatus();
}

bool Journal::WantsRewrite() const {
  return appended_bytes_ > kRewriteAfterBytes && appended_bytes_ > base_bytes_;
}

}  // namespace ctrun
