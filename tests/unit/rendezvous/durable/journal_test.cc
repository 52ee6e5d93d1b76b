#include "rendezvous/durable/journal.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "rendezvous/durable/durable_state.h"

namespace ctrun {
namespace {

v1::JournalRecord JobAt(const std::string& id, int64_t round) {
  v1::JournalRecord r;
  r.mutable_job()->set_job_id(id);
  r.mutable_job()->set_round(round);
  r.mutable_job()->set_phase(v1::JobStatus::RUNNING);
  return r;
}

v1::JournalRecord Put(const std::string& id, int64_t round,
                      const std::string& key, const std::string& value) {
  v1::JournalRecord r;
  r.mutable_put()->set_job_id(id);
  r.mutable_put()->set_round(round);
  r.mutable_put()->set_key(key);
  r.mutable_put()->set_value(value);
  return r;
}

TEST_CASE("Replaying a journal gives each job's last round and its keys",
          "[journal][unit]") {
  std::string bytes;
  bytes += FrameRecord(JobAt("a", 0));
  bytes += FrameRecord(Put("a", 0, "old", "x"));
  bytes += FrameRecord(JobAt("a", 1));  // a new round: a new store
  bytes += FrameRecord(Put("a", 1, "k", "v1"));
  bytes += FrameRecord(Put("a", 0, "late", "ignored"));  // of an ended round
  bytes += FrameRecord(Put("a", 1, "k", std::string("v2\0bin", 6)));
  bytes += FrameRecord(Put("a", 1, "gone", "y"));
  v1::JournalRecord del;
  del.mutable_delete_()->set_job_id("a");
  del.mutable_delete_()->set_round(1);
  del.mutable_delete_()->set_key("gone");
  bytes += FrameRecord(del);
  v1::JournalRecord change;
  change.mutable_change()->set_job_id("a");
  change.mutable_change()->set_round(1);
  auto* added = change.mutable_change()->add_keys();
  added->set_key("both");
  added->set_value("1");
  auto* removed = change.mutable_change()->add_keys();
  removed->set_key("k");
  removed->set_deleted(true);
  bytes += FrameRecord(change);
  bytes += FrameRecord(JobAt("b", 0));
  v1::JournalRecord forget;
  forget.set_forget_job("b");
  bytes += FrameRecord(forget);

  const JournalContents contents = ReadJournal(bytes);
  CHECK(contents.damage.empty());
  CHECK(contents.records == 11);
  CHECK(contents.whole == bytes);
  REQUIRE(contents.jobs.size() == 1);
  const JournaledJob& a = contents.jobs.at("a");
  CHECK(a.snapshot.round() == 1);
  CHECK(a.keys == std::map<std::string, std::string>{{"both", "1"}});
}

TEST_CASE("A record cut short at the end is told from damage before it",
          "[journal][unit]") {
  const std::string good =
      FrameRecord(JobAt("a", 0)) + FrameRecord(Put("a", 0, "k", "v"));
  const std::string next = FrameRecord(Put("a", 0, "k2", "v2"));

  SECTION("cut short: a torn tail") {
    const std::string bytes = good + next.substr(0, next.size() - 1);
    const JournalContents contents = ReadJournal(bytes);
    CHECK(contents.TornTailOnly());
    CHECK(contents.damage[0].begin == good.size());
    CHECK(contents.jobs.at("a").keys.size() == 1);
  }
  SECTION("zeroes at the end: a torn tail") {
    const JournalContents contents = ReadJournal(good + std::string(100, '\0'));
    CHECK(contents.TornTailOnly());
    CHECK(contents.records == 2);
  }
  SECTION("a flipped byte with whole records after it: damage") {
    std::string damaged = next;
    damaged.back() ^= 0x40;
    const std::string after = FrameRecord(Put("a", 0, "k3", "v3"));
    const JournalContents contents = ReadJournal(good + damaged + after);
    REQUIRE(contents.damage.size() == 1);
    CHECK_FALSE(contents.TornTailOnly());
    CHECK(contents.damage[0].begin == good.size());
    CHECK(contents.damage[0].end == good.size() + damaged.size());
    // What is whole on either side is read.
    CHECK(contents.jobs.at("a").keys ==
          std::map<std::string, std::string>{{"k", "v"}, {"k3", "v3"}});
    CHECK(contents.whole == good + after);
  }
  SECTION("a whole last record that fails its CRC: damage") {
    std::string damaged = next;
    damaged.back() ^= 0x40;
    const JournalContents contents = ReadJournal(good + damaged);
    REQUIRE(contents.damage.size() == 1);
    CHECK_FALSE(contents.TornTailOnly());
  }
}

// A fresh state directory under the test's temporary directory.
struct StateDir {
  const std::string path = std::filesystem::temp_directory_path() /
                           ("ctrun-journal-" + std::to_string(getpid()));
  StateDir() { std::filesystem::remove_all(path); }
  ~StateDir() { std::filesystem::remove_all(path); }
  std::string journal() const { return path + "/journal"; }
};

TEST_CASE("A journal outlives its writer and keeps out a second one",
          "[journal][unit]") {
  StateDir dir;
  auto files = NewPosixStateFiles();
  std::map<std::string, JournaledJob> jobs;
  {
    auto journal = Journal::Open({dir.path, files.get()}, &jobs);
    REQUIRE(journal.ok());
    CHECK(jobs.empty());
    REQUIRE((*journal)->Append(JobAt("a", 2)).ok());
    REQUIRE((*journal)->Append(Put("a", 2, "k", "v")).ok());
    REQUIRE((*journal)->Commit(/*sync=*/true).ok());

    auto second = Journal::Open({dir.path, files.get()}, &jobs);
    REQUIRE_FALSE(second.ok());
    CHECK(absl::IsFailedPrecondition(second.status()));
    CHECK(second.status().message().find("in use by another ctrund") !=
          std::string::npos);
  }
  // A crash in the middle of an append leaves half a record behind.
  std::ofstream(dir.journal(), std::ios::app) << "\x10\x00";
  {
    auto journal = Journal::Open({dir.path, files.get()}, &jobs);
    REQUIRE(journal.ok());
    REQUIRE(jobs.size() == 1);
    CHECK(jobs.at("a").snapshot.round() == 2);
    CHECK(jobs.at("a").keys.at("k") == "v");
    // Appends go after the last whole record, and a rewrite replaces all.
    REQUIRE((*journal)->Append(Put("a", 2, "k2", "v2")).ok());
    REQUIRE((*journal)->Rewrite({JobAt("b", 5)}).ok());
    REQUIRE((*journal)->Append(Put("b", 5, "x", "y")).ok());
  }
  {
    auto journal = Journal::Open({dir.path, files.get()}, &jobs);
    REQUIRE(journal.ok());
    REQUIRE(jobs.size() == 1);
    CHECK(jobs.at("b").keys.at("x") == "y");
  }
}

TEST_CASE(
    "A write cut short by a full disk leaves no trace, and later ones "
    "are read back",
    "[journal][unit]") {
  StateDir dir;
  FaultInjectingFiles files(NewPosixStateFiles());
  std::map<std::string, JournaledJob> jobs;
  {
    auto journal = Journal::Open({dir.path, &files}, &jobs);
    REQUIRE(journal.ok());
    REQUIRE((*journal)->Append(JobAt("a", 0)).ok());
    files.FailNextAppendAfter(11);
    const absl::Status full = (*journal)->Append(Put("a", 0, "lost", "x"));
    CHECK(absl::IsResourceExhausted(full));
    // Space came back.
    REQUIRE((*journal)->Append(Put("a", 0, "kept", "y")).ok());
    REQUIRE((*journal)->Commit(true).ok());
  }
  CHECK(ReadJournal(*NewPosixStateFiles()->Read(dir.journal())).damage.empty());
  auto journal = Journal::Open({dir.path, &files}, &jobs);
  REQUIRE(journal.ok());
  CHECK(jobs.at("a").keys == std::map<std::string, std::string>{{"kept", "y"}});
}

TEST_CASE("A failed sync takes back every record since the last commit",
          "[journal][unit]") {
  StateDir dir;
  FaultInjectingFiles files(NewPosixStateFiles());
  std::map<std::string, JournaledJob> jobs;
  {
    auto journal = Journal::Open({dir.path, &files}, &jobs);
    REQUIRE(journal.ok());
    REQUIRE((*journal)->Append(JobAt("a", 0)).ok());
    REQUIRE((*journal)->Commit(true).ok());
    REQUIRE((*journal)->Append(Put("a", 0, "one", "1")).ok());
    REQUIRE((*journal)->Append(Put("a", 0, "two", "2")).ok());
    files.FailNextSync();
    CHECK_FALSE((*journal)->Commit(true).ok());
    REQUIRE((*journal)->Append(Put("a", 0, "three", "3")).ok());
    REQUIRE((*journal)->Commit(true).ok());
  }
  auto journal = Journal::Open({dir.path, &files}, &jobs);
  REQUIRE(journal.ok());
  CHECK(jobs.at("a").keys ==
        std::map<std::string, std::string>{{"three", "3"}});
}

TEST_CASE(
    "Damage before the end is refused with its offset, and repaired "
    "only when asked, keeping the damaged file",
    "[journal][unit]") {
  StateDir dir;
  auto files = NewPosixStateFiles();
  std::map<std::string, JournaledJob> jobs;
  std::string bytes = FrameRecord(JobAt("a", 0));
  const size_t damaged_at = bytes.size();
  bytes += FrameRecord(Put("a", 0, "k0", "v"));
  bytes[damaged_at + 9] ^= 0x01;  // a byte of the record's body
  for (int i = 1; i <= 50; ++i) {
    bytes += FrameRecord(Put("a", 0, "k" + std::to_string(i), "v"));
  }
  std::filesystem::create_directories(dir.path);
  std::ofstream(dir.journal(), std::ios::binary) << bytes;

  auto refused = Journal::Open({dir.path, files.get()}, &jobs);
  REQUIRE_FALSE(refused.ok());
  CHECK(absl::IsFailedPrecondition(refused.status()));
  const std::string message(refused.status().message());
  CHECK(message.find(absl::StrCat("bytes ", damaged_at, " to ")) !=
        std::string::npos);
  CHECK(message.find("--state-dir-repair") != std::string::npos);
  // Nothing was changed.
  CHECK(*files->Read(dir.journal()) == bytes);

  auto repaired =
      Journal::Open({dir.path, files.get(), /*repair=*/true}, &jobs);
  REQUIRE(repaired.ok());
  CHECK(jobs.at("a").keys.size() == 50);
  CHECK_FALSE(jobs.at("a").keys.contains("k0"));
  int copies = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path)) {
    if (entry.path().filename().string().rfind("journal.damaged-", 0) == 0) {
      ++copies;
      CHECK(*files->Read(entry.path()) == bytes);
    }
  }
  CHECK(copies == 1);
  CHECK(ReadJournal(*files->Read(dir.journal())).damage.empty());
}

TEST_CASE("What was committed outlives a machine crash unless fsync=never",
          "[journal][unit]") {
  StateDir dir;
  const auto policy =
      GENERATE(FsyncPolicy::kAlways, FsyncPolicy::kBatch, FsyncPolicy::kNever);
  INFO(FsyncPolicyName(policy));
  auto owned = std::make_unique<FaultInjectingFiles>(NewPosixStateFiles());
  FaultInjectingFiles* files = owned.get();
  std::map<std::string, JournaledJob> jobs;
  auto state = DurableState::Open(
      {policy, JournalOpener(dir.path, false, std::move(owned))}, &jobs);
  REQUIRE(state.ok());
  (*state)->SaveJobs({"a"}, [](const std::string& id) {
    return std::optional<v1::JobSnapshot>(JobAt(id, 0).job());
  });
  v1::StoreScope scope;
  scope.set_job_id("a");
  REQUIRE((*state)->AppendStoreChange(scope, {{"k", "v"}}).ok());
  REQUIRE((*state)->Commit().ok());
  REQUIRE(files->DropUnsynced().ok());  // the machine crashed

  const JournalContents after = ReadJournal(*files->Read(dir.journal()));
  if (policy == FsyncPolicy::kNever) {
    CHECK(after.jobs.empty());
  } else {
    REQUIRE(after.jobs.size() == 1);
    CHECK(after.jobs.at("a").keys ==
          std::map<std::string, std::string>{{"k", "v"}});
  }
}

TEST_CASE(
    "A job whose state could not be saved refuses store changes until "
    "it is",
    "[journal][unit]") {
  StateDir dir;
  auto owned = std::make_unique<FaultInjectingFiles>(NewPosixStateFiles());
  FaultInjectingFiles* files = owned.get();
  std::map<std::string, JournaledJob> jobs;
  auto state = DurableState::Open(
      {FsyncPolicy::kBatch, JournalOpener(dir.path, false, std::move(owned))},
      &jobs);
  REQUIRE(state.ok());
  auto snapshot = [](const std::string& id) {
    return std::optional<v1::JobSnapshot>(JobAt(id, 0).job());
  };
  files->FailNextSync();
  (*state)->SaveJobs({"a"}, snapshot);
  CHECK((*state)->HasUnsavedJobs());
  v1::StoreScope scope;
  scope.set_job_id("a");
  const absl::Status refused = (*state)->AppendStoreChange(scope, {{"k", "v"}});
  CHECK(absl::IsUnavailable(refused));
  (*state)->SaveJobs({}, snapshot);  // the next tick tries again
  CHECK_FALSE((*state)->HasUnsavedJobs());
  REQUIRE((*state)->AppendStoreChange(scope, {{"k", "v"}}).ok());
  REQUIRE((*state)->Commit().ok());
  CHECK(ReadJournal(*files->Read(dir.journal())).jobs.at("a").keys.size() == 1);
}

}  // namespace
}  // namespace ctrun
