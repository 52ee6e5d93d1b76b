#include "ctrun/gloo.h"

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <stdexcept>

#include "absl/strings/str_cat.h"

namespace ctrun {
namespace {

// Gloo's store interface over the job's store. Gloo reports failures by
// exception; the status travels inside one and is taken out again in
// CreateGlooContext.
class StoreError : public std::runtime_error {
 public:
  explicit StoreError(absl::Status status)
      : std::runtime_error(status.ToString()), status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(WorkerStore& store, absl::Duration timeout)
      : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_.Set(key, std::string(data.begin(), data.end())));
  }
  std::vector<char> get(const std::string& key) override {
    auto value = store_.Get(key, timeout_);
    Check(value.status());
    return std::vector<char>(value->begin(), value->end());
  }
  void wait(const std::vector<std::string>& keys) override {
    Check(store_.Wait(keys, timeout_));
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    Check(store_.Wait(keys, absl::FromChrono(timeout)));
  }

 private:
  static void Check(const absl::Status& status) {
    if (!status.ok()) throw StoreError(status);
  }
  WorkerStore& store_;
  const absl::Duration timeout_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<gloo::Context>> CreateGlooContext(
    const WorkerIdentity& identity, WorkerStore& store, int sequence,
    absl::Duration timeout) {
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = identity.node_address;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    GlooStore base(store, timeout);
    gloo::rendezvous::PrefixStore prefixed(absl::StrCat("gloo/", sequence),
                                           base);
    auto context = std::make_shared<gloo::rendezvous::Context>(
        identity.rank, identity.world_size);
    context->setTimeout(absl::ToChronoMilliseconds(timeout));
    context->connectFullMesh(prefixed, device);
    return context;
  } catch (const StoreError& e) {
    return e.status();
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("Gloo rendezvous of rank ", identity.rank, " of ",
                     identity.world_size, " failed: ", e.what()));
  }
}

}  // namespace ctrun
