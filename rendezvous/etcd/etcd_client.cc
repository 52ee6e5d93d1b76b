#include "rendezvous/etcd/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "rendezvous/rpc/endpoint.h"
#include "rendezvous/rpc/grpc_status.h"
#include "rendezvous/rpc/user_file.h"

namespace ctrun {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  auto pem = ReadUserFile(
      path, absl::StrCat("the etcd ", what, " file").c_str(), kMaxPemBytes);
  if (pem.ok() && pem->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the etcd ", what, " file '", path, "' is empty"));
  }
  return pem;
}

}  // namespace

std::string PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) != 0xff) {
      end.back() = static_cast<char>(end.back() + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Open(
    const EtcdOptions& options) {
  auto endpoints = ParseEndpointList(options.endpoints);
  if (!endpoints.ok()) return endpoints.status();
  auto target = ChannelTarget(*endpoints);
  if (!target.ok()) return target.status();
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      grpc::InsecureChannelCredentials();
  if (!options.ca_file.empty()) {
    grpc::SslCredentialsOptions ssl;
    auto ca = ReadPem(options.ca_file, "CA");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    if (options.cert_file.empty() != options.key_file.empty()) {
      return absl::InvalidArgumentError(
          "an etcd client certificate needs its key, and a key its "
          "certificate");
    }
    if (!options.cert_file.empty()) {
      auto cert = ReadPem(options.cert_file, "certificate");
      if (!cert.ok()) return cert.status();
      auto key = ReadPem(options.key_file, "key");
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
    }
    credentials = grpc::SslCredentials(ssl);
  } else if (!options.cert_file.empty() || !options.key_file.empty()) {
    return absl::InvalidArgumentError(
        "an etcd client certificate needs the CA to verify etcd with");
  }
  grpc::ChannelArguments args;
  // A replica that loses its etcd member moves on to the next one quickly.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 256 << 20);
  args.SetInt(GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, 256 << 20);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 2'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 1'000);
  return std::unique_ptr<EtcdClient>(new EtcdClient(
      JoinEndpoints(*endpoints),
      grpc::CreateCustomChannel(*target, credentials, args), options.timeout));
}

EtcdClient::EtcdClient(std::string endpoints,
                       std::shared_ptr<grpc::Channel> channel,
                       absl::Duration timeout)
    : endpoints_(std::move(endpoints)),
      channel_(std::move(channel)),
      kv_(etcdserverpb::KV::NewStub(channel_)),
      lease_(etcdserverpb::Lease::NewStub(channel_)),
      maintenance_(etcdserverpb::Maintenance::NewStub(channel_)),
      timeout_(timeout) {}

void EtcdClient::Prepare(grpc::ClientContext* context,
                         absl::Duration timeout) const {
  if (timeout == absl::ZeroDuration()) timeout = timeout_;
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

absl::Status EtcdClient::Failed(const char* call,
                                const grpc::Status& status) const {
  const absl::Status s = FromGrpcStatus(status);
  return absl::Status(s.code(), absl::StrCat("etcd at ", endpoints_, ": ", call,
                                             ": ", s.message()));
}

absl::StatusOr<std::vector<etcdserverpb::KeyValue>> EtcdClient::Range(
    const std::string& key, const std::string& range_end) {
  std::vector<etcdserverpb::KeyValue> kvs;
  etcdserverpb::RangeRequest request;
  request.set_key(key);
  request.set_range_end(range_end);
  // Pages keep each answer well under the message limit, whatever the
  // values' sizes (etcd's default request limit is 1.5 MiB a value).
  request.set_limit(range_end.empty() ? 0 : 64);
  while (true) {
    grpc::ClientContext context;
    Prepare(&context);
    etcdserverpb::RangeResponse response;
    if (grpc::Status s = kv_->Range(&context, request, &response); !s.ok()) {
      return Failed("Range", s);
    }
    for (auto& kv : *response.mutable_kvs()) kvs.push_back(std::move(kv));
    if (!response.more() || kvs.empty()) return kvs;
    // The rest, at the same revision so that the pages agree.
    request.set_key(kvs.back().key() + std::string(1, '\0'));
    request.set_revision(response.header().revision());
  }
}

absl::StatusOr<etcdserverpb::TxnResponse> EtcdClient::Txn(
    const etcdserverpb::TxnRequest& request, absl::Duration timeout) {
  grpc::ClientContext context;
  Prepare(&context, timeout);
  etcdserverpb::TxnResponse response;
  if (grpc::Status s = kv_->Txn(&context, request, &response); !s.ok()) {
    return Failed("Txn", s);
  }
  return response;
}

absl::StatusOr<std::pair<int64_t, absl::Duration>> EtcdClient::GrantLease(
    absl::Duration ttl) {
  grpc::ClientContext context;
  Prepare(&context);
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1))));
  etcdserverpb::LeaseGrantResponse response;
  if (grpc::Status s = lease_->LeaseGrant(&context, request, &response);
      !s.ok()) {
    return Failed("LeaseGrant", s);
  }
  if (!response.error().empty()) {
    return absl::UnavailableError(absl::StrCat(
        "etcd at ", endpoints_, ": LeaseGrant: ", response.error()));
  }
  return std::make_pair(response.id(), absl::Seconds(response.ttl()));
}

absl::StatusOr<absl::Duration> EtcdClient::KeepAlive(int64_t id,
                                                     absl::Duration timeout) {
  grpc::ClientContext context;
  Prepare(&context, timeout);
  auto stream = lease_->LeaseKeepAlive(&context);
  etcdserverpb::LeaseKeepAliveRequest request;
  request.set_id(id);
  etcdserverpb::LeaseKeepAliveResponse response;
  const bool answered = stream->Write(request) && stream->Read(&response);
  stream->WritesDone();
  context.TryCancel();
  const grpc::Status status = stream->Finish();
  if (!answered) {
    return Failed("LeaseKeepAlive",
                  status.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                             "the stream ended unanswered")
                              : status);
  }
  return absl::Seconds(response.ttl());
}

absl::Status EtcdClient::RevokeLease(int64_t id) {
  grpc::ClientContext context;
  Prepare(&context);
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(id);
  etcdserverpb::LeaseRevokeResponse response;
  if (grpc::Status s = lease_->LeaseRevoke(&context, request, &response);
      !s.ok()) {
    return Failed("LeaseRevoke", s);
  }
  return absl::OkStatus();
}

absl::StatusOr<etcdserverpb::StatusResponse> EtcdClient::Status() {
  grpc::ClientContext context;
  Prepare(&context);
  etcdserverpb::StatusResponse response;
  if (grpc::Status s = maintenance_->Status(&context, {}, &response); !s.ok()) {
    return Failed("Status", s);
  }
  return response;
}

}  // namespace ctrun
