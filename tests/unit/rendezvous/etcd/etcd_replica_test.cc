// The pure parts of ctrund on etcd: the lease as a replica's clock sees it,
// the key layout, and the leader record.
#include "rendezvous/etcd/etcd_replica.h"

#include <catch2/catch.hpp>

#include "rendezvous/core/leader_lease.h"
#include "rendezvous/etcd/etcd_client.h"
#include "rendezvous/etcd/etcd_log.h"

namespace ctrun {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);

TEST_CASE(
    "A leader serves for two thirds of the TTL from its last "
    "confirmed keepalive's sending",
    "[etcd][unit]") {
  LeaderLease lease(kStart, absl::Seconds(6));
  CHECK(lease.Valid(kStart));
  CHECK(lease.Valid(kStart + absl::Milliseconds(3999)));
  CHECK_FALSE(lease.Valid(kStart + absl::Seconds(4)));
  // Renewals go out every quarter TTL.
  CHECK(lease.next_renewal() == kStart + absl::Milliseconds(1500));

  // Confirmed at 5 s, sent at 1.5 s: counted from the sending.
  lease.OnRenewed(kStart + absl::Milliseconds(1500), absl::Seconds(6));
  CHECK(lease.valid_until() == kStart + absl::Milliseconds(5500));
  CHECK(lease.next_renewal() == kStart + absl::Seconds(3));
  // A late answer to an older keepalive does not shorten it.
  lease.OnRenewed(kStart + absl::Seconds(1), absl::Seconds(6));
  CHECK(lease.valid_until() == kStart + absl::Milliseconds(5500));
  // Whatever happens, it stops serving before etcd can expire the lease
  // (TTL after etcd last heard of it, which is after the sending).
  CHECK(lease.valid_until() < kStart + absl::Milliseconds(1500) + lease.ttl());
}

TEST_CASE("A lease etcd says is gone ends leadership at once", "[etcd][unit]") {
  LeaderLease lease(kStart, absl::Seconds(6));
  lease.OnRenewed(kStart + absl::Seconds(1), absl::ZeroDuration());
  CHECK(lease.lost());
  CHECK_FALSE(lease.Valid(kStart + absl::Seconds(1)));
  // Nothing revives it.
  lease.OnRenewed(kStart + absl::Seconds(2), absl::Seconds(6));
  CHECK_FALSE(lease.Valid(kStart + absl::Seconds(2)));
}

TEST_CASE("Log keys sort in commit order and name their writer",
          "[etcd][unit]") {
  const std::string a = EtcdLogKey("/p/", 9, 17);
  const std::string b = EtcdLogKey("/p/", 10, 5);
  CHECK(a == "/p/log/00000000000000000009.17");
  CHECK(a < b);
  auto parts = ParseEtcdLogKey("/p/", b);
  REQUIRE(parts);
  CHECK(parts->seq == 10);
  CHECK(parts->leader == 5);
  CHECK_FALSE(ParseEtcdLogKey("/q/", b));
  CHECK_FALSE(ParseEtcdLogKey("/p/", "/p/log/12.3"));
  CHECK_FALSE(ParseEtcdLogKey("/p/", "/p/log/00000000000000000009.x"));
  CHECK_FALSE(ParseEtcdLogKey("/p/", "/p/log/00000000000000000009.0"));
  CHECK_FALSE(ParseEtcdLogKey("/p/", "/p/log/0000000000000000000x.3"));
  CHECK(EtcdLeaderKey("/p/") == "/p/leader");
}

TEST_CASE("A prefix's range ends past every key that starts with it",
          "[etcd][unit]") {
  CHECK(PrefixEnd("/p/log/") == "/p/log0");
  CHECK(PrefixEnd("a\xff") == "b");
  CHECK(PrefixEnd("\xff\xff") == std::string(1, '\0'));
}

TEST_CASE("The leader record reads back, and junk is not one", "[etcd][unit]") {
  const absl::Time since = absl::FromUnixMillis(1796399337435);
  auto record = ParseLeaderRecord(FormatLeaderRecord("10.0.0.7:29400", since));
  REQUIRE(record);
  CHECK(record->address == "10.0.0.7:29400");
  CHECK(record->since == since);
  CHECK_FALSE(ParseLeaderRecord(""));
  CHECK_FALSE(ParseLeaderRecord("10.0.0.7:29400"));
  CHECK_FALSE(ParseLeaderRecord("10.0.0.7:29400\nsoon"));
  CHECK_FALSE(ParseLeaderRecord("\n12"));
}

}  // namespace
}  // namespace ctrun
