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

}  // namespace
}  // namespace ctrun
