// grpc_floor: the fastest a store get can be over gRPC on this machine.
//
//   grpc_floor CLIENTS SECONDS
//
// A server process that answers every StoreRequest at once with a fixed
// value (no lock, no lookup), and CLIENTS threads in this process, each on
// its own connection and Pipe stream, doing blocking request/response pairs.
// Whatever ctrund's store does beyond this is its own cost; this part is gRPC's
// and the kernel's. The timing starts once every client has had an answer;
// the server's peak RSS is gRPC's own memory for that many connections, the
// floor of ctrund's per agent. Prints one JSON line like rdzv_bench.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "ctrun/v1/store.grpc.pb.h"

namespace {

using ctrun::v1::StoreRequest;
using ctrun::v1::StoreResponse;

class EchoReactor final
    : public grpc::ServerBidiReactor<StoreRequest, StoreResponse> {
 public:
  EchoReactor() { StartRead(&in_); }
  void OnReadDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::OK);
    out_.Clear();
    out_.set_id(in_.id());
    out_.mutable_get()->set_value(std::string(64, 'v'));
    StartWrite(&out_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::OK);
    StartRead(&in_);
  }
  void OnDone() override { delete this; }

 private:
  StoreRequest in_;
  StoreResponse out_;
};

class EchoService final : public ctrun::v1::Store::CallbackService {
  grpc::ServerBidiReactor<StoreRequest, StoreResponse>* Pipe(
      grpc::CallbackServerContext*) override {
    return new EchoReactor();
  }
};

}  // namespace

// VmHWM of `pid`, in MiB; 0 when it cannot be read.
double PeakRssMib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atof(line.c_str() + 6) / 1024;
  }
  return 0;
}

int main(int argc, char** argv) {
  const int clients = argc > 1 ? std::atoi(argv[1]) : 1;
  const double seconds = argc > 2 ? std::atof(argv[2]) : 3;
  // The server gets its own process, as ctrund does; gRPC is started only
  // after the fork, in each process.
  int port_pipe[2];
  if (pipe(port_pipe) != 0) return 1;
  const pid_t server_pid = fork();
  if (server_pid == 0) {
    EchoService service;
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(&service);
    auto server = builder.BuildAndStart();
    if (write(port_pipe[1], &port, sizeof port) != sizeof port) _exit(1);
    server->Wait();  // until killed
    _exit(0);
  }
  int port = 0;
  if (read(port_pipe[0], &port, sizeof port) != sizeof port) return 1;

  std::atomic<long> ops{0};
  std::atomic<int> answered{0};
  std::atomic<bool> timing{false}, stop{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      grpc::ChannelArguments args;
      args.SetInt("ctrun.channel_id", i);  // one connection per client
      auto channel =
          grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                    grpc::InsecureChannelCredentials(), args);
      auto stub = ctrun::v1::Store::NewStub(channel);
      grpc::ClientContext context;
      auto stream = stub->Pipe(&context);
      StoreRequest request;
      request.mutable_get()->set_key("key");
      StoreResponse response;
      long n = 0;
      for (bool first = true; !stop; first = false) {
        request.set_id(n);
        if (!stream->Write(request) || !stream->Read(&response)) break;
        if (first) ++answered;
        n += timing;
      }
      ops += n;
      stream->WritesDone();
      stream->Finish().IgnoreError();
    });
  }
  const auto connect_by =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (answered < clients && std::chrono::steady_clock::now() < connect_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  timing = true;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : threads) t.join();
  const double rss_mib = PeakRssMib(server_pid);
  kill(server_pid, SIGKILL);
  waitpid(server_pid, nullptr, 0);
  std::printf(
      "{\"bench\":\"grpc_floor\",\"op\":\"get\",\"clients\":%d,"
      "\"ops_per_s\":%.0f,\"server_peak_rss_mib\":%.1f}\n",
      clients, static_cast<double>(ops) / seconds, rss_mib);
}
