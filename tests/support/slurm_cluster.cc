#include "tests/support/slurm_cluster.h"

#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace ctrun::testing {
namespace {

namespace fs = std::filesystem;

constexpr char kHosts[] = "/etc/hosts";

// Free TCP ports on 127.0.0.1, held open together so they are distinct.
std::vector<int> FreePorts(int n) {
  std::vector<int> fds, ports;
  for (int i = 0; i < n; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    fds.push_back(fd);
    ports.push_back(ntohs(a.sin_port));
  }
  for (int fd : fds) close(fd);
  return ports;
}

void WriteFile(const std::string& path, const std::string& text,
               mode_t mode = 0644) {
  std::ofstream(path) << text;
  chmod(path.c_str(), mode);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Rewrites /etc/hosts in place (it is often a bind mount, so no rename)
// without the lines that contain `marker`.
void RemoveHostsLines(const std::string& marker) {
  std::string kept;
  for (absl::string_view line : absl::StrSplit(ReadFile(kHosts), '\n')) {
    if (!line.empty() && line.find(marker) == absl::string_view::npos)
      absl::StrAppend(&kept, line, "\n");
  }
  std::ofstream(kHosts, std::ios::trunc) << kept;
}

// Runs argv to its end; its stdout, or nullopt when it fails or hangs.
std::optional<std::string> Run(std::vector<std::string> argv,
                               std::vector<std::string> env) {
  ChildProcess p(std::move(argv), std::move(env));
  std::string out = p.ReadAll(absl::Seconds(30));
  if (p.Wait(absl::Seconds(5)) != 0) return std::nullopt;
  return out;
}

// Stops `p` with SIGTERM, then SIGKILL (its destructor) after `grace`.
void Stop(std::unique_ptr<ChildProcess>& p, absl::Duration grace) {
  if (p == nullptr) return;
  p->Signal(SIGTERM);
  p->Wait(grace);
  p.reset();
}

}  // namespace

SlurmCluster::SlurmCluster() {
  for (const char* tool : {"/usr/sbin/munged", "/usr/sbin/slurmctld",
                           "/usr/sbin/slurmd", "/usr/bin/sbatch"}) {
    INFO(tool << " is missing: scripts/setup.sh installs munge, slurmctld, "
                 "slurmd and slurm-client");
    REQUIRE(access(tool, X_OK) == 0);
  }
  INFO("the Slurm tests start slurmd, which needs root");
  REQUIRE(geteuid() == 0);

  munged_ = std::make_unique<Munged>();
  std::string work = fs::temp_directory_path() / "ctrun-slurm-XXXXXX";
  REQUIRE(mkdtemp(work.data()) != nullptr);
  work_dir_ = work;
  chmod(work_dir_.c_str(), 0755);
  conf_path_ = work_dir_ + "/slurm.conf";
  hosts_marker_ = absl::StrCat("# ctrun-test ", work_dir_);

  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::vector<int> ports = FreePorts(3);
  const int first_job_id =
      1000 + static_cast<int>(std::random_device()() % 50000);
  std::string conf = absl::StrCat(
      "ClusterName=ctrun-test\n",                    //
      "SlurmctldHost=", host, "(127.0.0.1)\n",       //
      "SlurmctldPort=", ports[0], "\n",              //
      "SlurmUser=root\nSlurmdUser=root\n",           //
      "AuthType=auth/munge\nCredType=cred/munge\n",  //
      "AuthInfo=socket=", munged_->socket(), "\n",   //
      "StateSaveLocation=", work_dir_, "/state\n",   //
      "SlurmdSpoolDir=", work_dir_, "/spool-%n\n",   //
      "SlurmctldPidFile=", work_dir_, "/slurmctld.pid\n",
      "SlurmdPidFile=", work_dir_, "/slurmd-%n.pid\n",
      "SlurmctldLogFile=", work_dir_, "/slurmctld.log\n",
      "SlurmdLogFile=", work_dir_, "/slurmd-%n.log\n",
      // No cgroups in a container: track processes by parentage.
      "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n",
      "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n",
      "MpiDefault=none\nReturnToService=2\nKillWait=5\n",
      // Ended jobs leave squeue quickly: `sbatch --wait` polls for that.
      "MinJobAge=5\n",  //
      "FirstJobId=", first_job_id, "\n", "GresTypes=gpu\n");
  for (int n : {1, 2}) {
    absl::StrAppend(&conf, "NodeName=ctn", n, " NodeHostname=", host,
                    " NodeAddr=127.0.0.1 Port=", ports[n],
                    " CPUs=2 RealMemory=1000 Gres=gpu:fake:2 State=UNKNOWN\n");
  }
  absl::StrAppend(&conf,
                  "PartitionName=main Nodes=ctn[1-2] Default=YES "
                  "MaxTime=INFINITE State=UP\n");
  WriteFile(conf_path_, conf);
  // Any two device files do for GPUs that nothing opens.
  WriteFile(work_dir_ + "/gres.conf",
            "NodeName=ctn[1-2] Name=gpu Type=fake File=/dev/null,/dev/zero\n");
  fs::create_directories(work_dir_ + "/state");

  // One cluster runs at a time (ctest's resource lock): lines of another
  // are left by a test process that was killed before its teardown.
  RemoveHostsLines("# ctrun-test ");
  std::ofstream(kHosts, std::ios::app)
      << "127.0.0.1 ctn1 ctn2 " << hosts_marker_ << "\n";

  // The daemons log to their files; their stdout goes there too, so that no
  // pipe fills up.
  auto daemon = [&](const std::string& command, const std::string& log) {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{
            "/bin/sh", "-c",
            absl::StrCat("exec ", command, " -f ", conf_path_, " >>", work_dir_,
                         "/", log, " 2>&1")},
        Env());
  };
  try {
    slurmctld_ = daemon("/usr/sbin/slurmctld -D -i", "slurmctld.out");
    for (int n : {1, 2}) {
      slurmds_.push_back(daemon(absl::StrCat("/usr/sbin/slurmd -D -N ctn", n),
                                absl::StrCat("slurmd-ctn", n, ".out")));
    }
    WaitForIdleNodes();
  } catch (...) {  // a failed REQUIRE: no destructor will run
    TearDown();
    throw;
  }
}

SlurmCluster::~SlurmCluster() { TearDown(); }

void SlurmCluster::TearDown() {
  // Jobs first: steps outlive a stopped slurmd.
  if (auto jobs = Run({"/usr/bin/squeue", "-h", "-o", "%i"}, Env())) {
    for (absl::string_view id :
         absl::StrSplit(*jobs, '\n', absl::SkipWhitespace())) {
      Run({"/usr/bin/scancel", std::string(absl::StripAsciiWhitespace(id))},
          Env());
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      auto left = Run({"/usr/bin/squeue", "-h", "-o", "%i"}, Env());
      if (!left || absl::StripAsciiWhitespace(*left).empty()) break;
      absl::SleepFor(absl::Milliseconds(200));
    }
  }
  for (auto& slurmd : slurmds_) Stop(slurmd, absl::Seconds(10));
  Stop(slurmctld_, absl::Seconds(10));
  KillLeftovers();
  munged_.reset();
  RemoveHostsLines(hosts_marker_);
  // Its configuration, spool and job scripts: nothing runs from it now.
  if (!work_dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(work_dir_, ec);
  }
}

std::vector<std::string> SlurmCluster::Env() const {
  return {"SLURM_CONF=" + conf_path_};
}

SlurmCluster::Job SlurmCluster::Submit(const std::string& name,
                                       const std::string& script,
                                       std::vector<std::string> env,
                                       std::vector<std::string> sbatch_args) {
  const std::string path = absl::StrCat(work_dir_, "/", name, ".sh");
  WriteFile(path, script, 0755);
  for (auto& e : Env()) env.push_back(e);
  Job job;
  std::vector<std::string> argv = {
      "/usr/bin/sbatch", "--wait", "--parsable", "-o",
      absl::StrCat(work_dir_, "/", name, "-%j.out")};
  argv.insert(argv.end(), sbatch_args.begin(), sbatch_args.end());
  argv.push_back(path);
  job.sbatch = std::make_unique<ChildProcess>(argv, env);
  auto line = job.sbatch->ReadLine(absl::Seconds(30));
  INFO("sbatch: " << job.sbatch->Stderr());
  REQUIRE(line);
  // "JOBID" or "JOBID;CLUSTER".
  job.id =
      std::string(absl::StripAsciiWhitespace(line->substr(0, line->find(';'))));
  job.output_path = absl::StrCat(work_dir_, "/", name, "-", job.id, ".out");
  return job;
}

std::optional<int> SlurmCluster::Wait(Job& job, absl::Duration timeout) {
  return job.sbatch->Wait(timeout);
}

std::string SlurmCluster::Output(const Job& job) const {
  return ReadFile(job.output_path);
}

std::optional<std::string> SlurmCluster::TryCommand(
    std::vector<std::string> argv) const {
  return Run(std::move(argv), Env());
}

std::string SlurmCluster::Command(std::vector<std::string> argv) const {
  const std::string command = argv[0];
  auto out = Run(std::move(argv), Env());
  INFO(command << " failed");
  REQUIRE(out);
  return *out;
}

void SlurmCluster::WaitForIdleNodes() {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  std::string states;
  bool resumed = false;
  while (absl::Now() < deadline) {
    states =
        Run({"/usr/bin/sinfo", "-h", "-N", "-o", "%N %t"}, Env()).value_or("");
    if (states == "ctn1 idle\nctn2 idle\n") return;
    if (!resumed && (states.find("down") != std::string::npos ||
                     states.find("drain") != std::string::npos)) {
      Run({"/usr/bin/scontrol", "update", "nodename=ctn[1-2]", "state=resume"},
          Env());
      resumed = true;
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
  INFO("node states: " << states << "\nslurmctld.log:\n"
                       << ReadFile(work_dir_ + "/slurmctld.log"));
  FAIL("the Slurm nodes did not become idle within a minute");
}

void SlurmCluster::KillLeftovers() const {
  const std::string needle = "SLURM_CONF=" + conf_path_;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return;
  while (dirent* e = readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(atoi(e->d_name));
    if (pid <= 0 || pid == getpid()) continue;
    const std::string environ =
        ReadFile(absl::StrCat("/proc/", pid, "/environ"));
    for (absl::string_view var : absl::StrSplit(environ, '\0')) {
      if (var == needle) {
        kill(pid, SIGKILL);
        break;
      }
    }
  }
  closedir(proc);
}

}  // namespace ctrun::testing
