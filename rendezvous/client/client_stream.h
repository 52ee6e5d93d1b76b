// ClientStream: a client-side bidirectional stream with a write queue, for
// gRPC's callback API. Used by SessionStream and StoreClient.
//
// Writes go one at a time from a queue. A hold keeps gRPC from ending the
// stream while this side may still start a write; it is released once no
// write will start again (after a half-close, or when the stream broke).
//
// The owner keeps the stream alive until it is done (Wait), and destroys it
// on its own thread. Destroying it on a gRPC callback thread would free the
// call there, racing with the owner freeing the channel: gRPC 1.51 then tears
// down its callback completion queue under its own threads and aborts
// ("assertion failed: prior > 0" in grpc_cq_internal_unref).
#ifndef CTRUN_RENDEZVOUS_CLIENT_CLIENT_STREAM_H_
#define CTRUN_RENDEZVOUS_CLIENT_CLIENT_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <deque>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rendezvous/rpc/grpc_status.h"

namespace ctrun {

template <typename Out, typename In>
class ClientStream : public grpc::ClientBidiReactor<Out, In> {
 public:
  grpc::ClientContext& context() { return context_; }

  // Starts the call. The RPC must already be bound to this reactor
  // (stub->async()->Method(&context(), this)); messages sent before Begin
  // go first.
  void Begin() {
    this->AddHold();
    this->StartRead(&in_);
    this->StartCall();
  }

  // Queues a message. False when the stream is closing or broken (the
  // message is dropped).
  bool Send(Out message) {
    const Out* next = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (closing_ || broken_) return false;
      out_.push_back(std::move(message));
      next = NextWriteLocked();
    }
    if (next != nullptr) this->StartWrite(next);
    return true;
  }

  // Half-closes after the queued messages.
  void Close() {
    bool writes_done = false;
    bool release = false;
    {
      absl::MutexLock lock(&mu_);
      if (closing_ || broken_) return;
      closing_ = true;
      writes_done = WritesDoneDueLocked();
      release = ReleaseDueLocked();
    }
    if (writes_done) this->StartWritesDone();
    if (release) this->RemoveHold();
  }

  // Ends the stream at once.
  void Cancel() { context_.TryCancel(); }

  // Blocks until gRPC is done with the stream; then it may be destroyed.
  absl::Status Wait() {
    absl::MutexLock lock(&completion_->mu);
    completion_->mu.Await(absl::Condition(&Done, &completion_->status));
    return *completion_->status;
  }

  // The final status, or nullopt if not done within `timeout`.
  std::optional<absl::Status> WaitFor(absl::Duration timeout) {
    absl::MutexLock lock(&completion_->mu);
    completion_->mu.AwaitWithTimeout(
        absl::Condition(&Done, &completion_->status), timeout);
    return completion_->status;
  }

  bool done() {
    absl::MutexLock lock(&completion_->mu);
    return completion_->status.has_value();
  }

 protected:
  // A message arrived; runs on a gRPC thread, one at a time.
  virtual void OnMessage(const In& message) = 0;
  // The stream ended with `status`; runs once, before Wait returns.
  virtual void OnFinished(const absl::Status& status) = 0;

 private:
  static bool Done(std::optional<absl::Status>* done) {
    return done->has_value();
  }

  const Out* NextWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || out_.empty() || broken_) return nullptr;
    writing_ = true;
    return &out_.front();  // deque elements stay put on push_back
  }
  bool WritesDoneDueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!closing_ || writing_ || !out_.empty() || writes_done_ || broken_) {
      return false;
    }
    writes_done_ = true;
    return true;
  }
  bool ReleaseDueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (hold_released_ || writing_) return false;
    if (!writes_done_ && !broken_) return false;
    hold_released_ = true;
    return true;
  }

  void OnReadDone(bool ok) final {
    if (ok) {
      OnMessage(in_);
      this->StartRead(&in_);
      return;
    }
    bool release;
    {
      absl::MutexLock lock(&mu_);
      broken_ = true;
      release = ReleaseDueLocked();
    }
    if (release) this->RemoveHold();
  }

  void OnWriteDone(bool ok) final {
    const Out* next = nullptr;
    bool writes_done = false;
    bool release = false;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      out_.pop_front();
      if (!ok) {
        broken_ = true;
        out_.clear();
      }
      next = NextWriteLocked();
      if (next == nullptr) writes_done = WritesDoneDueLocked();
      release = ReleaseDueLocked();
    }
    if (next != nullptr) this->StartWrite(next);
    if (writes_done) this->StartWritesDone();
    if (release) this->RemoveHold();
  }

  void OnWritesDoneDone(bool) final {}

  void OnDone(const grpc::Status& status) final {
    const absl::Status result = FromGrpcStatus(status);
    OnFinished(result);
    {
      absl::MutexLock lock(&mu_);
      broken_ = true;
    }
    // Once the status is set the owner may destroy this object; the
    // completion outlives it through this reference.
    std::shared_ptr<Completion> completion = completion_;
    absl::MutexLock lock(&completion->mu);
    completion->status = result;
  }

  // The end of the stream, shared with OnDone's last moments.
  struct Completion {
    absl::Mutex mu;
    std::optional<absl::Status> status ABSL_GUARDED_BY(mu);
  };

  grpc::ClientContext context_;
  In in_;  // only touched by the read chain
  const std::shared_ptr<Completion> completion_ =
      std::make_shared<Completion>();

  absl::Mutex mu_;
  std::deque<Out> out_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool writes_done_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool hold_released_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_CLIENT_CLIENT_STREAM_H_
