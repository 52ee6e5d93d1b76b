// Run folders under --log_dir.
#include "launcher/workers/run_directory.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "launcher/workers/proc.h"

namespace ctrun {
namespace {

TEST_CASE("A job id is one folder name under the log dir, whatever it holds",
          "[launcher][unit]") {
  CHECK(RunFolderName("job-7") == "job-7");
  CHECK(RunFolderName("../x") == ".._x");
  CHECK(RunFolderName("a/b/c") == "a_b_c");
  CHECK(RunFolderName("/") == "_");
  CHECK(RunFolderName("") == "job");
  CHECK(RunFolderName(std::string(300, 'x')).size() == 200);
  // ".." alone gets mkdtemp's suffix: ".._XXXXXX" is a plain name.
  CHECK(RunFolderName("..") == "..");
}

}  // namespace
}  // namespace ctrun

namespace ctrun {
namespace {

TEST_CASE(
    "A file the agent writes among the workers' replaces a FIFO or a link at "
    "its temporary name, never follows one, and is read back only if regular",
    "[launcher][unit]") {
  char dir_template[] = "/tmp/ctrun-unit-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  const std::string path = dir + "/usage.txt";
  const std::string other = dir + "/other";
  std::ofstream(other) << "keep";
  // A FIFO at the temporary name (an open for writing would wait for a
  // reader for ever) and a link there to another file.
  REQUIRE(mkfifo((path + ".new").c_str(), 0600) == 0);
  CHECK(ReplaceFile(path, "rank 0\n"));
  CHECK(ReadProcFile(path) == "rank 0\n");
  REQUIRE(symlink(other.c_str(), (path + ".new").c_str()) == 0);
  CHECK(ReplaceFile(path, "rank 1\n"));
  CHECK(ReadProcFile(path) == "rank 1\n");
  CHECK(ReadProcFile(other) == "keep");
  // A FIFO where a file is read gives nothing at once.
  const std::string fifo = dir + "/rank0.python.txt";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(ReadProcFile(fifo).empty());
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "A noted rendezvous is found while its agent lives, and never from a "
    "folder of a dead agent or through a link or a FIFO",
    "[launcher][unit]") {
  char tmp_template[] = "/tmp/ctrun-unit-XXXXXX";
  const std::string tmp = mkdtemp(tmp_template);
  auto run_folder = [&](const std::string& name) {
    const std::string folder = tmp + "/" + name;
    std::filesystem::create_directories(folder);
    REQUIRE(MarkRunDirectory(folder).ok());  // this process: alive
    return folder;
  };
  const std::string live = run_folder("ctrun-live00");
  REQUIRE(NoteRendezvous(live, {"127.0.0.1:4321", "job-a", "secret"}).ok());
  // Written once: a second note (or one a worker put there first) fails.
  CHECK_FALSE(NoteRendezvous(live, {"127.0.0.1:1", "x", "y"}).ok());
  struct stat st {};
  REQUIRE(stat((live + "/.ctrun/rendezvous").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  // The same note in a folder whose mark names a process that is gone.
  const std::string dead = run_folder("ctrun-dead00");
  REQUIRE(NoteRendezvous(dead, {"127.0.0.1:4322", "job-b", "s"}).ok());
  std::ofstream(dead + "/.ctrun/agent") << "999999999 1 " << PidScope() << "\n";
  // A link and a FIFO where the note would be.
  const std::string linked = run_folder("ctrun-link00");
  REQUIRE(symlink((live + "/.ctrun/rendezvous").c_str(),
                  (linked + "/.ctrun/rendezvous").c_str()) == 0);
  const std::string fifo = run_folder("ctrun-fifo00");
  REQUIRE(mkfifo((fifo + "/.ctrun/rendezvous").c_str(), 0600) == 0);
  const std::vector<NotedRendezvous> found = FindNotedRendezvous(tmp);
  REQUIRE(found.size() == 1);
  CHECK(found[0].endpoint == "127.0.0.1:4321");
  CHECK(found[0].run_id == "job-a");
  CHECK(found[0].token == "secret");
  CHECK(found[0].agent == getpid());
  CHECK(found[0].folder == live);
  std::filesystem::remove_all(tmp);
}

}  // namespace
}  // namespace ctrun
