#include "rendezvous/journal.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

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
  bytes += FrameRecord(JobAt("b", 0));
  v1::JournalRecord forget;
  forget.set_forget_job("b");
  bytes += FrameRecord(forget);

  size_t dropped = 99;
  auto jobs = ReplayJournal(bytes, &dropped);
  CHECK(dropped == 0);
  REQUIRE(jobs.size() == 1);
  const JournaledJob& a = jobs.at("a");
  CHECK(a.snapshot.round() == 1);
  CHECK(a.keys ==
        std::map<std::string, std::string>{{"k", std::string("v2\0bin", 6)}});
}

TEST_CASE("A record cut short or damaged ends the replay there",
          "[journal][unit]") {
  const std::string good =
      FrameRecord(JobAt("a", 0)) + FrameRecord(Put("a", 0, "k", "v"));
  const std::string next = FrameRecord(Put("a", 0, "k2", "v2"));
  size_t dropped = 0;

  SECTION("cut short") {
    auto jobs = ReplayJournal(good + next.substr(0, next.size() - 1), &dropped);
    CHECK(dropped == next.size() - 1);
    CHECK(jobs.at("a").keys.size() == 1);
  }
  SECTION("a flipped byte fails the CRC") {
    std::string damaged = next;
    damaged.back() ^= 0x40;
    auto jobs = ReplayJournal(good + damaged + next, &dropped);
    CHECK(dropped == 2 * next.size());
    CHECK(jobs.at("a").keys.size() == 1);
  }
  SECTION("an absurd length") {
    auto jobs = ReplayJournal(good + std::string(8, '\xff'), &dropped);
    CHECK(dropped == 8);
    CHECK(jobs.size() == 1);
  }
}

TEST_CASE("A journal outlives its writer and keeps out a second one",
          "[journal][unit]") {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("ctrun-journal-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::map<std::string, JournaledJob> jobs;
  {
    auto journal = Journal::Open(dir, &jobs);
    REQUIRE(journal.ok());
    CHECK(jobs.empty());
    REQUIRE((*journal)->Append(JobAt("a", 2), /*sync=*/true).ok());
    REQUIRE((*journal)->Append(Put("a", 2, "k", "v"), /*sync=*/false).ok());

    auto second = Journal::Open(dir, &jobs);
    REQUIRE_FALSE(second.ok());
    CHECK(absl::IsFailedPrecondition(second.status()));
    CHECK(second.status().message().find("in use by another ctrund") !=
          std::string::npos);
  }
  // A crash in the middle of an append leaves half a record behind.
  std::ofstream(dir + "/journal", std::ios::app) << "\x10\x00";
  {
    auto journal = Journal::Open(dir, &jobs);
    REQUIRE(journal.ok());
    REQUIRE(jobs.size() == 1);
    CHECK(jobs.at("a").snapshot.round() == 2);
    CHECK(jobs.at("a").keys.at("k") == "v");
    // Appends go after the last whole record, and a rewrite replaces all.
    REQUIRE((*journal)->Append(Put("a", 2, "k2", "v2"), false).ok());
    REQUIRE((*journal)->Rewrite({JobAt("b", 5)}).ok());
    REQUIRE((*journal)->Append(Put("b", 5, "x", "y"), false).ok());
  }
  {
    auto journal = Journal::Open(dir, &jobs);
    REQUIRE(journal.ok());
    REQUIRE(jobs.size() == 1);
    CHECK(jobs.at("b").keys.at("x") == "y");
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ctrun
