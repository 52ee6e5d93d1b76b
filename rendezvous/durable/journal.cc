#include "rendezvous/durable/journal.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ctrun {
namespace {

constexpr size_t kHeaderBytes = 8;
// A record larger than this is damage, not data: the biggest real one is a
// job of max nodes, or one request's keys and values.
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

// The store of `job_id` at `round`, or null when the journal's state has
// moved past that round.
std::map<std::string, std::string>* KeysOf(
    std::map<std::string, JournaledJob>* jobs, const std::string& job_id,
    int64_t round) {
  auto it = jobs->find(job_id);
  if (it == jobs->end() || it->second.snapshot.round() != round) return nullptr;
  return &it->second.keys;
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
    case v1::JournalRecord::kPut:
      if (auto* keys =
              KeysOf(jobs, record.put().job_id(), record.put().round())) {
        (*keys)[record.put().key()] = record.put().value();
      }
      return;
    case v1::JournalRecord::kDelete:
      if (auto* keys = KeysOf(jobs, record.delete_().job_id(),
                              record.delete_().round())) {
        keys->erase(record.delete_().key());
      }
      return;
    case v1::JournalRecord::kChange:
      if (auto* keys =
              KeysOf(jobs, record.change().job_id(), record.change().round())) {
        for (const auto& key : record.change().keys()) {
          if (key.deleted()) {
            keys->erase(key.key());
          } else {
            (*keys)[key.key()] = key.value();
          }
        }
      }
      return;
    case v1::JournalRecord::KIND_NOT_SET:
      return;
  }
}

// The size of the whole record at `offset` (parsed into `*record`), or 0
// when none starts there. Zeroes (a file extended but never written) are
// no record: a real one is never empty.
size_t WholeRecordAt(absl::string_view bytes, size_t offset,
                     v1::JournalRecord* record) {
  if (bytes.size() - offset < kHeaderBytes) return 0;
  const uint32_t length = GetLittleEndian(bytes.data() + offset);
  if (length == 0 || length > kMaxRecordBytes ||
      bytes.size() - offset - kHeaderBytes < length) {
    return 0;
  }
  const absl::string_view body = bytes.substr(offset + kHeaderBytes, length);
  if (Crc32(body) != GetLittleEndian(bytes.data() + offset + 4) ||
      !record->ParseFromArray(body.data(), static_cast<int>(body.size())) ||
      record->kind_case() == v1::JournalRecord::KIND_NOT_SET) {
    return 0;
  }
  return kHeaderBytes + length;
}

// Whether the bytes from `offset` to the end are what an interrupted append
// leaves: a header cut short, a length beyond the end, or zeroes.
bool CutShort(absl::string_view bytes, size_t offset) {
  const absl::string_view tail = bytes.substr(offset);
  if (tail.size() < kHeaderBytes) return true;
  if (GetLittleEndian(tail.data()) > tail.size() - kHeaderBytes) return true;
  return tail.find_first_not_of('\0') == absl::string_view::npos;
}

std::string DescribeDamage(const JournalContents& contents) {
  const DamagedBytes& first = contents.damage.front();
  std::string text = absl::StrCat("bytes ", first.begin, " to ", first.end,
                                  " hold no whole record");
  if (contents.damage.size() > 1) {
    absl::StrAppend(&text, ", and ", contents.damage.size() - 1,
                    " more damaged stretches follow");
  }
  return text;
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

JournalContents ReadJournal(absl::string_view bytes) {
  JournalContents contents;
  size_t offset = 0;
  v1::JournalRecord record;
  while (offset < bytes.size()) {
    if (const size_t size = WholeRecordAt(bytes, offset, &record); size > 0) {
      Apply(record, &contents.jobs);
      ++contents.records;
      contents.whole.append(bytes.data() + offset, size);
      offset += size;
      continue;
    }
    DamagedBytes damaged{offset, offset + 1};
    while (damaged.end < bytes.size() &&
           WholeRecordAt(bytes, damaged.end, &record) == 0) {
      ++damaged.end;
    }
    if (damaged.end == bytes.size())
      damaged.cut_short = CutShort(bytes, offset);
    contents.damage.push_back(damaged);
    offset = damaged.end;
  }
  return contents;
}

Journal::Journal(std::string dir, StateFiles* files, int lock_fd)
    : dir_(std::move(dir)), files_(files), lock_fd_(lock_fd) {}

Journal::~Journal() {
  close(lock_fd_);  // releases the lock
}

absl::StatusOr<std::unique_ptr<Journal>> Journal::Open(
    const Options& options, std::map<std::string, JournaledJob>* jobs) {
  const std::string& dir = options.dir;
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("cannot create the state directory ", dir));
  }
  const std::string lock_path = dir + "/lock";
  const int lock_fd =
      open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", lock_path));
  }
  if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    close(lock_fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "the state directory ", dir,
        " is in use by another ctrund; each daemon needs its own"));
  }
  std::unique_ptr<Journal> journal(new Journal(dir, options.files, lock_fd));
  const std::string path = journal->path();
  auto bytes = options.files->Read(path);
  if (absl::IsNotFound(bytes.status())) bytes = std::string();
  if (!bytes.ok()) return bytes.status();
  JournalContents contents = ReadJournal(*bytes);
  journal->end_ = bytes->size();
  if (contents.TornTailOnly()) {
    // A crash cut the last write short: that record was never answered.
    const DamagedBytes& tail = contents.damage.front();
    spdlog::warn(
        "dropped the last {} bytes of {}: a record cut short by a "
        "crash while it was written",
        tail.end - tail.begin, path);
    journal->end_ = tail.begin;
    if (auto s = options.files->Truncate(path, tail.begin); !s.ok()) return s;
  } else if (!contents.damage.empty() && !options.repair) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " is damaged: ", DescribeDamage(contents),
        ", which is not what a crash mid-write leaves. Nothing was changed; "
        "start ctrund with --state-dir-repair to keep a copy of the damaged "
        "file and restore the whole records"));
  } else if (!contents.damage.empty()) {
    const std::string copy = absl::StrCat(
        path, ".damaged-",
        absl::FormatTime("%Y%m%dT%H%M%S", absl::Now(), absl::UTCTimeZone()));
    if (auto s = options.files->Link(path, copy); !s.ok()) return s;
    if (auto s = journal->Replace(contents.whole); !s.ok()) return s;
    spdlog::warn(
        "repaired {}: {}; the damaged records are lost (each was a "
        "job's state or one store change), the {} whole ones are "
        "kept; the damaged file is {}",
        path, DescribeDamage(contents), contents.records, copy);
  }
  journal->committed_ = journal->end_;
  journal->base_bytes_ = journal->end_;
  *jobs = std::move(contents.jobs);
  return journal;
}

absl::Status Journal::CutBack() {
  if (auto s = files_->Truncate(path(), end_); !s.ok()) {
    dirty_tail_ = true;
    return s;
  }
  dirty_tail_ = false;
  return absl::OkStatus();
}

absl::Status Journal::Append(const v1::JournalRecord& record) {
  if (dirty_tail_) {
    if (auto s = CutBack(); !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("an earlier failed write is still in "
                                       "the journal: ",
                                       s.message()));
    }
  }
  const std::string framed = FrameRecord(record);
  if (auto s = files_->Append(path(), framed); !s.ok()) {
    CutBack().IgnoreError();  // Append then refuses until it works
    return s;
  }
  end_ += framed.size();
  appended_bytes_ += framed.size();
  return absl::OkStatus();
}

absl::Status Journal::Commit(bool sync) {
  if (sync && end_ > committed_) {
    if (auto s = files_->Sync(path()); !s.ok()) {
      // The kernel may have dropped those pages: nothing of them may be
      // read back after a restart, since their changes are refused.
      end_ = committed_;
      CutBack().IgnoreError();
      return s;
    }
  }
  committed_ = end_;
  return absl::OkStatus();
}

absl::Status Journal::Replace(const std::string& bytes) {
  const std::string next = path() + ".next";
  if (auto s = files_->WriteSynced(next, bytes); !s.ok()) return s;
  if (auto s = files_->Rename(next, path()); !s.ok()) return s;
  end_ = committed_ = base_bytes_ = bytes.size();
  appended_bytes_ = 0;
  dirty_tail_ = false;
  return absl::OkStatus();
}

absl::Status Journal::Rewrite(const std::vector<v1::JournalRecord>& records) {
  std::string bytes;
  for (const auto& record : records) bytes += FrameRecord(record);
  return Replace(bytes);
}

bool Journal::WantsRewrite() const {
  return appended_bytes_ > kRewriteAfterBytes && appended_bytes_ > base_bytes_;
}

RecordLogOpener JournalOpener(std::string dir, bool repair,
                              std::shared_ptr<StateFiles> files) {
  return [dir = std::move(dir), repair,
          files = std::move(files)](std::map<std::string, JournaledJob>* jobs)
             -> absl::StatusOr<std::unique_ptr<RecordLog>> {
    auto journal = Journal::Open({dir, files.get(), repair}, jobs);
    if (!journal.ok()) return journal.status();
    (*journal)->owned_files_ = files;
    return std::unique_ptr<RecordLog>(*std::move(journal));
  };
}

}  // namespace ctrun
