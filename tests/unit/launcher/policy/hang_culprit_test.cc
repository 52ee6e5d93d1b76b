// Reading a hung job's stacks: which rank the others wait for.
#include "launcher/policy/hang_culprit.h"

#include <catch2/catch.hpp>

namespace ctrun {
namespace {

using Place = StackReading::Place;

// As faulthandler wrote them for a 4-rank Gloo job whose rank 2 sleeps
// before its all-reduce (tests/e2e/python/hang_allreduce.py).
constexpr char kInAllReduce[] =
    "Thread 0x00007f03d17566c0 (most recent call first):\n"
    "  File \"/usr/lib/python3.11/threading.py\", line 320 in wait\n"
    "  File \"/usr/lib/python3.11/threading.py\", line 1002 in _bootstrap\n"
    "\n"
    "Current thread 0x00007f03f4384040 (most recent call first):\n"
    "  File \"/usr/lib/python3/dist-packages/torch/distributed/"
    "distributed_c10d.py\", line 1541 in all_reduce\n"
    "  File \"/work/train/hang_allreduce.py\", line 27 in <module>\n";
constexpr char kSleeping[] =
    "Current thread 0x00007fa6ef258040 (most recent call first):\n"
    "  File \"/work/train/model.py\", line 25 in step\n"
    "  File \"/work/train/hang_allreduce.py\", line 40 in <module>\n";

// gdb's, shortened: the main thread (LWP = pid) waits in c10d::Work::wait.
constexpr char kNativeWaiting[] =
    "[New LWP 23859]\n"
    "Thread 2 (Thread 0x7f03d1f576c0 (LWP 23859) \"python3.11\"):\n"
    "#0  0x00007f03eb081d6b in gloo::transport::tcp::UnboundBuffer::"
    "waitRecv(int*) () from /lib/libgloo.so.0\n"
    "\n"
    "Thread 1 (Thread 0x7f03f4384040 (LWP 23854) \"python3.11\"):\n"
    "#0  __futex_abstimed_wait_common64 (private=0) at "
    "./nptl/futex-internal.c:57\n"
    "#5  0x00007f03efec2843 in c10d::Work::wait(std::chrono::duration<long, "
    "std::ratio<1l, 1000l> >) () from /lib/x86_64-linux-gnu/libtorch_cpu.so\n"
    "#21 0x0000000000627bd1 in _start ()\n";
// A C++ worker sleeping in its own code, other threads in Gloo.
constexpr char kNativeSleeping[] =
    "Thread 2 (Thread 0x7f03d1f576c0 (LWP 501) \"trainer\"):\n"
    "#0  0x00007f03eb081d6b in gloo::transport::tcp::Loop::run() () from "
    "/lib/libgloo.so.0\n"
    "Thread 1 (Thread 0x7fa6ef258040 (LWP 500) \"trainer\"):\n"
    "#0  0x00007fa6ef328545 in __GI___clock_nanosleep (clock_id=1) at "
    "../sysdeps/unix/sysv/linux/clock_nanosleep.c:48\n"
    "#1  0x00007fa6ef32d2a7 in __GI___nanosleep () at nanosleep.c:25\n"
    "#2  0x0000555555555209 in LoadBatch (step=8) at /src/trainer.cc:41\n"
    "#3  0x0000555555555300 in main () at /src/trainer.cc:70\n";

TEST_CASE("A Python stack in torch.distributed waits, one elsewhere does not",
          "[launcher][unit]") {
  const StackReading waiting = ReadPythonStack(kInAllReduce);
  CHECK(waiting.place == Place::kWaiting);
  CHECK(waiting.where == "all_reduce");
  CHECK(waiting.source == "Python");
  const StackReading sleeping = ReadPythonStack(kSleeping);
  CHECK(sleeping.place == Place::kElsewhere);
  CHECK(sleeping.where == "model.py, line 25, in step");
  CHECK(ReadPythonStack("").place == Place::kUnknown);
}

TEST_CASE("The main Python thread is the one running the module's body",
          "[launcher][unit]") {
  // The thread that took the signal is a helper in torch.distributed; the
  // main thread (outermost frame <module>) sleeps in the script.
  const std::string dump =
      "Current thread 0x01 (most recent call first):\n"
      "  File \"/usr/lib/python3/dist-packages/torch/distributed/"
      "elastic/timer/file_based_local_timer.py\", line 90 in _watch\n"
      "  File \"/usr/lib/python3.11/threading.py\", line 1002 in _bootstrap\n"
      "\n"
      "Thread 0x02 (most recent call first):\n"
      "  File \"/work/train.py\", line 7 in <module>\n";
  const StackReading r = ReadPythonStack(dump);
  CHECK(r.place == Place::kElsewhere);
  CHECK(r.where == "train.py, line 7, in <module>");
}

TEST_CASE("Backward under DDP waits for the gradients' all-reduce",
          "[launcher][unit]") {
  const std::string dump =
      "Current thread 0x01 (most recent call first):\n"
      "  File \"/usr/lib/python3/dist-packages/torch/autograd/__init__.py\", "
      "line 197 in backward\n"
      "  File \"/usr/lib/python3/dist-packages/torch/_tensor.py\", line 488 "
      "in backward\n"
      "  File \"/work/ddp.py\", line 30 in <module>\n";
  const StackReading r = ReadPythonStack(dump);
  CHECK(r.place == Place::kWaiting);
  CHECK(r.where == "backward");
}

TEST_CASE("A native stack is read from the thread whose LWP is the pid",
          "[launcher][unit]") {
  const StackReading waiting = ReadNativeStack(kNativeWaiting, 23854);
  CHECK(waiting.place == Place::kWaiting);
  CHECK(waiting.where == "c10d::Work::wait");
  CHECK(waiting.source == "native");
  // The same threads read for another pid: no main thread among them.
  CHECK(ReadNativeStack(kNativeWaiting, 1).place == Place::kUnknown);
  // Gloo's own thread does not make the process wait; its main thread's
  // first frame of its own code says where it is.
  const StackReading sleeping = ReadNativeStack(kNativeSleeping, 500);
  CHECK(sleeping.place == Place::kElsewhere);
  CHECK(sleeping.where == "LoadBatch at trainer.cc:41");
}

TEST_CASE(
    "The Python stack decides, and the native one stands in for a missing one",
    "[launcher][unit]") {
  CHECK(ReadStacks(kSleeping, kNativeWaiting, 23854).place ==
        Place::kElsewhere);
  const StackReading native = ReadStacks("", kNativeWaiting, 23854);
  CHECK(native.place == Place::kWaiting);
  CHECK(native.source == "native");
}

RankReading Rank(int rank, const char* python) {
  return RankReading{rank, rank, ReadPythonStack(python)};
}

TEST_CASE("The rank outside the collective holds up those waiting in it",
          "[launcher][unit]") {
  const auto v = JudgeHang({Rank(0, kInAllReduce), Rank(1, kInAllReduce),
                            Rank(2, kSleeping), Rank(3, kInAllReduce)});
  REQUIRE(v);
  CHECK(v->culprits == std::vector<int>{2});
  CHECK(v->waiting == std::vector<int>{0, 1, 3});
  CHECK(v->line ==
        "rank 2 holds up the job: its main thread is outside any collective "
        "(at model.py, line 25, in step) while ranks 0, 1, 3 wait in "
        "all_reduce; decided from the workers' Python stacks");
}

TEST_CASE("Two ranks outside, stacks of both kinds: all are named",
          "[launcher][unit]") {
  const auto v =
      JudgeHang({Rank(4, kSleeping),
                 RankReading{5, 1, ReadNativeStack(kNativeWaiting, 23854)},
                 RankReading{6, 2, ReadNativeStack(kNativeSleeping, 500)},
                 RankReading{7, 3, {}}});
  REQUIRE(v);
  CHECK(v->culprits == std::vector<int>{4, 6});
  CHECK(v->waiting == std::vector<int>{5});
  CHECK(v->line ==
        "ranks 4, 6 hold up the job: their main threads are outside any "
        "collective (rank 4 at model.py, line 25, in step; rank 6 at "
        "LoadBatch at trainer.cc:41) while rank 5 waits in c10d::Work::wait; "
        "decided from the workers' Python and native stacks");
}

TEST_CASE("Every rank waiting: the one they wait for is on another node",
          "[launcher][unit]") {
  const auto v = JudgeHang({Rank(0, kInAllReduce), Rank(1, kInAllReduce)});
  REQUIRE(v);
  CHECK(v->culprits.empty());
  CHECK(v->line ==
        "every worker here (ranks 0, 1) waits in all_reduce: the rank they "
        "wait for is not on this node; decided from the workers' Python "
        "stacks");
}

TEST_CASE("No rank waiting in a collective: the stacks decide nothing",
          "[launcher][unit]") {
  CHECK_FALSE(JudgeHang({Rank(0, kSleeping), Rank(1, kSleeping)}));
  CHECK_FALSE(JudgeHang({Rank(0, ""), Rank(1, "")}));
  CHECK_FALSE(JudgeHang({}));
}

}  // namespace
}  // namespace ctrun
