// ServerStream: a server-side bidirectional stream with a write queue, for
// gRPC's callback API.
//
// gRPC allows one write in flight per stream; ServerStream queues the rest
// and writes them in order, then finishes the stream once its queue is
// empty. Enqueue only queues (it may be called under the caller's own lock,
// which fixes the order of messages); Flush starts the I/O and must be
// called without that lock, since gRPC may run reactions on the calling
// thread.
//
// The stream keeps itself alive (a shared_ptr to itself) from Begin until
// gRPC calls OnDone, so owners may hold shared_ptrs that outlive it safely:
// calls after the stream is done are ignored.
#ifndef CTRUN_RENDEZVOUS_SERVER_SERVER_STREAM_H_
#define CTRUN_RENDEZVOUS_SERVER_SERVER_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <deque>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "rendezvous/rpc/grpc_status.h"

namespace ctrun {

template <typename In, typename Out>
class ServerStream : public grpc::ServerBidiReactor<In, Out> {
 public:
  // Starts reading. `self` must own this object.
  void Begin(std::shared_ptr<ServerStream> self) {
    self_ = std::move(self);
    this->StartRead(&in_);
  }

  // Finishes the stream with `why` without reading anything.
  void Refuse(std::shared_ptr<ServerStream> self, const absl::Status& why) {
    self_ = std::move(self);
    {
      absl::MutexLock lock(&mu_);
      finished_ = true;
    }
    this->Finish(ToGrpcStatus(why));
  }

  // Queues a message; dropped once the stream is finishing or broken.
  void Enqueue(Out message) {
    absl::MutexLock lock(&mu_);
    if (broken_ || finish_) return;
    out_.push_back(std::move(message));
  }

  // Finishes the stream with `status` once the queue is written. The first
  // status wins.
  void EnqueueFinish(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    if (!finish_) finish_ = ToGrpcStatus(status);
  }

  // Starts the next write, or the finish once everything is written.
  void Flush() {
    const Out* next = nullptr;
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || writing_) return;
      if (!out_.empty() && !broken_) {
        writing_ = true;
        next = &out_.front();  // deque elements stay put on push_back
      } else if (finish_) {
        finished_ = true;
        finish = *finish_;
      }
    }
    if (next != nullptr) this->StartWrite(next);
    if (finish) this->Finish(*finish);
  }

 protected:
  // A message arrived; runs on a gRPC thread, one at a time.
  virtual void OnMessage(const In& message) = 0;
  // The peer half-closed or the stream broke. The stream then finishes with
  // OK, unless a finish was already enqueued.
  virtual void OnPeerGone() = 0;
  // gRPC is done with the stream: nothing more will be written.
  virtual void OnStreamDone() {}

 private:
  void OnReadDone(bool ok) final {
    if (!ok) {
      OnPeerGone();
      // gRPC tells a message that does not parse from a half-close only in
      // this: a stream that ends before its first message is refused.
      EnqueueFinish(read_any_
                        ? absl::OkStatus()
                        : absl::InvalidArgumentError(
                              "the stream ended before a whole first message: "
                              "it sent none, or one that does not parse as "
                              "this service's request"));
      Flush();
      return;
    }
    read_any_ = true;
    OnMessage(in_);
    {
      absl::MutexLock lock(&mu_);
      if (finish_ || finished_) return;
    }
    this->StartRead(&in_);
  }

  void OnWriteDone(bool ok) final {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      out_.pop_front();
      if (!ok) {
        broken_ = true;
        out_.clear();
      }
    }
    Flush();
  }

  void OnDone() final {
    OnStreamDone();
    // Last use of `this`: the reference may be the last one.
    std::shared_ptr<ServerStream> self = std::move(self_);
  }

  In in_;                  // only touched by the read chain
  bool read_any_ = false;  // likewise
  std::shared_ptr<ServerStream> self_;

  absl::Mutex mu_;
  std::deque<Out> out_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> finish_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_SERVER_SERVER_STREAM_H_
