#include "launcher/policy/classify_failure.h"

#include <signal.h>

#include <catch2/catch.hpp>

namespace ctrun {
namespace {

// A failure with exit code 1 and these last lines.
FailureFacts Lines(std::vector<std::string> lines, int exit_code = 1) {
  FailureFacts f;
  f.exit_code = exit_code;
  f.last_lines = std::move(lines);
  return f;
}

TEST_CASE("A Python import, syntax or missing-file error is a user error",
          "[launcher][unit]") {
  for (const std::string& last :
       {std::string("ModuleNotFoundError: No module named 'nonexistent'"),
        std::string("ImportError: cannot import name 'x' from 'y'"),
        std::string("SyntaxError: invalid syntax"),
        std::string("IndentationError: unexpected indent"),
        std::string("FileNotFoundError: [Errno 2] No such file or directory: "
                    "'data/train.bin'")}) {
    CAPTURE(last);
    const ClassifiedFailure c = ClassifyFailure(
        Lines({"Traceback (most recent call last):",
               "  File \"/job/train.py\", line 3, in <module>", last}));
    CHECK(c.failure_class == v1::USER_ERROR);
    CHECK(c.error == last);
  }
  // The last exception decides: one raised while handling an ImportError
  // is not the user's.
  CHECK(ClassifyFailure(Lines({"ImportError: optional thing missing",
                               "During handling of the above exception, "
                               "another exception occurred:",
                               "ValueError: bad shape"}))
            .failure_class == v1::OTHER);
}

TEST_CASE("A bad argument, a missing script or program is a user error",
          "[launcher][unit]") {
  const ClassifiedFailure argparse = ClassifyFailure(
      Lines({"usage: train.py [-h] [--lr LR]",
             "train.py: error: unrecognized arguments: --lrr 0.1"},
            2));
  CHECK(argparse.failure_class == v1::USER_ERROR);
  CHECK(argparse.error == "train.py: error: unrecognized arguments: --lrr 0.1");
  const ClassifiedFailure script = ClassifyFailure(Lines(
      {"/usr/bin/python3: can't open file '/job/tarin.py': [Errno 2] No such "
       "file or directory"},
      2));
  CHECK(script.failure_class == v1::USER_ERROR);
  CHECK(script.error.find("can't open file") != std::string::npos);
  CHECK(ClassifyFailure(Lines({}, 127)).failure_class == v1::USER_ERROR);
  // ": error: " with another exit code is not argparse's.
  CHECK(ClassifyFailure(Lines({"loader: error: shard 3 is short"}, 1))
            .failure_class == v1::OTHER);
}

TEST_CASE("Out of memory, from the kernel or from CUDA", "[launcher][unit]") {
  FailureFacts killed;
  killed.signal = SIGKILL;
  killed.oom_killed = true;
  CHECK(ClassifyFailure(killed).failure_class == v1::OUT_OF_MEMORY);
  const ClassifiedFailure cuda = ClassifyFailure(
      Lines({"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
             "2.00 GiB (GPU 0; 79.10 GiB total capacity)"}));
  CHECK(cuda.failure_class == v1::OUT_OF_MEMORY);
  CHECK(cuda.error.rfind("torch.OutOfMemoryError: CUDA out of memory", 0) == 0);
  CHECK(cuda.error.size() <= 200);
}

TEST_CASE("Hardware and driver faults, before communication failures",
          "[launcher][unit]") {
  CHECK(ClassifyFailure(
            Lines({"torch.distributed.DistBackendError: NCCL error in: "
                   "ProcessGroupNCCL.cpp:1970, unhandled system error"}))
            .failure_class == v1::HARDWARE);
  CHECK(ClassifyFailure(Lines({"RuntimeError: CUDA error: uncorrectable ECC "
                               "error encountered"}))
            .failure_class == v1::HARDWARE);
  CHECK(ClassifyFailure(Lines({"RuntimeError: CUDA error: all CUDA-capable "
                               "devices are busy or unavailable"}))
            .failure_class == v1::HARDWARE);
  CHECK(ClassifyFailure(
            Lines({"torch.distributed.DistBackendError: NCCL error in: "
                   "ProcessGroupNCCL.cpp:1970, remote process exited or "
                   "there was a network error"}))
            .failure_class == v1::NETWORK);
  const ClassifiedFailure gloo = ClassifyFailure(
      Lines({"RuntimeError: [../third_party/gloo/gloo/transport/tcp/"
             "pair.cc:534] Connection closed by peer [127.0.0.1]:40123"}));
  CHECK(gloo.failure_class == v1::NETWORK);
  CHECK(gloo.error.rfind("RuntimeError: [", 0) == 0);
}

TEST_CASE(
    "Signals from outside, crashes, hangs and plain failures, and the error "
    "file first",
    "[launcher][unit]") {
  FailureFacts killed;
  killed.signal = SIGKILL;
  CHECK(ClassifyFailure(killed).failure_class == v1::SIGNAL);
  killed.signal = SIGTERM;
  CHECK(ClassifyFailure(killed).failure_class == v1::SIGNAL);
  FailureFacts crash;
  crash.signal = SIGSEGV;
  CHECK(ClassifyFailure(crash).failure_class == v1::OTHER);
  FailureFacts hung;
  hung.hung = true;
  hung.last_lines = {"ModuleNotFoundError: No module named 'x'"};
  CHECK(ClassifyFailure(hung).failure_class == v1::HANG);
  CHECK(ClassifyFailure(Lines({"step 10", "ValueError: bad shape"}))
            .failure_class == v1::OTHER);
  CHECK(ClassifyFailure(Lines({"ValueError: bad shape"})).error ==
        "ValueError: bad shape");
  CHECK(ClassifyFailure(Lines({"loss 0.3"}, 3)).error.empty());
  // The error file's message outranks the output's lines.
  FailureFacts recorded = Lines({"ValueError: printed earlier"});
  recorded.error_message = "FileNotFoundError: [Errno 2] ckpt/latest.pt";
  CHECK(ClassifyFailure(recorded).failure_class == v1::USER_ERROR);
  // Lines that name an error but are no exception's do not count as one.
  CHECK(
      ClassifyFailure(Lines({"epoch 3: ImportError count 0"})).failure_class ==
      v1::OTHER);
}

}  // namespace
}  // namespace ctrun
