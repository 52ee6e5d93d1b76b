#include "ctrun/store.h"

#include "absl/strings/str_cat.h"
#include "progress_internal.h"
#include "rendezvous/client/client.h"

namespace ctrun {

class WorkerStore::Impl {
 public:
  Impl(Connection connection, std::string job, int64_t round)
      : client(std::move(connection), std::move(job), round) {}
  StoreClient client;
};

absl::StatusOr<std::unique_ptr<WorkerStore>> WorkerStore::Connect(
    const WorkerIdentity& identity) {
  if (!identity.has_store()) {
    return absl::FailedPreconditionError(
        "no job store: this worker was not started by ctrun "
        "(CTRUN_STORE_ENDPOINT is not set)");
  }
  ConnectionOptions options;
  options.endpoint = identity.store_endpoint;
  options.token = identity.store_token;
  if (identity.store_munge) {
    options.munge = MungeAuth{identity.munge_socket, identity.store_job};
  }
  options.tls_ca_file = identity.store_tls_ca;
  auto connection = Connection::Open(options);
  if (!connection.ok()) return connection.status();
  progress_internal::MarkStoreUsed();
  return std::unique_ptr<WorkerStore>(new WorkerStore(std::make_unique<Impl>(
      *connection, identity.store_job, identity.store_round)));
}

WorkerStore::WorkerStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
WorkerStore::~WorkerStore() = default;

absl::Status WorkerStore::Set(const std::string& key,
                              const std::string& value) {
  return impl_->client.Set(key, value);
}
absl::StatusOr<std::string> WorkerStore::Get(const std::string& key,
                                             absl::Duration wait) {
  return impl_->client.Get(key, wait);
}
absl::StatusOr<int64_t> WorkerStore::Add(const std::string& key,
                                         int64_t delta) {
  return impl_->client.Add(key, delta);
}
absl::StatusOr<bool> WorkerStore::Check(const std::vector<std::string>& keys) {
  return impl_->client.Check(keys);
}
absl::Status WorkerStore::Wait(const std::vector<std::string>& keys,
                               absl::Duration timeout) {
  return impl_->client.Wait(keys, timeout);
}
absl::StatusOr<bool> WorkerStore::Delete(const std::string& key) {
  return impl_->client.Delete(key);
}

}  // namespace ctrun
