#!/usr/bin/env bash
# Installs every build and test dependency from Debian's packages.
# A quick no-op when everything is already installed.
#
#   scripts/setup.sh           build and test dependencies
#   scripts/setup.sh --bench   also what bench/run-all.sh needs (gnuplot)
#   scripts/setup.sh --fuzz    also what scripts/fuzz.sh needs (clang)
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git ccache
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev libcli11-dev catch2 libgloo-dev libssl-dev
  python3 python3-torch procps openssl
  # The wheel's test: a fresh virtualenv with pip; a program linking zlib
  # for the binary check's own test.
  python3-venv python3-pip zlib1g-dev
  # Native stacks of hung workers (launcher/workers/evidence.h); strace for
  # the test that ctrun reads no other process's /proc entries.
  gdb strace
  # --numa_binding: CPU and memory locality of each worker's GPU.
  libhwloc-dev
  # ctrund replicas on etcd: the tests run a private 3-member etcd.
  etcd-server
  # The Slurm end-to-end tests run a private Slurm with munge.
  slurmctld slurmd slurm-client munge libmunge-dev
  # The real Prometheus that scrapes ctrund's metrics in the tests; man
  # pages from --help; the Debian package.
  prometheus help2man dpkg-dev fakeroot jq
)
case "${1:-}" in
  # torchrun's etcd-v2 rendezvous, the peer of ctrund on etcd.
  --bench) PACKAGES+=(gnuplot-nox python3-etcd) ;;
  --fuzz) PACKAGES+=(clang-14 libclang-rt-14-dev) ;;
esac

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
# Packages with daemons (etcd, slurmctld, munge) must not start them: the
# tests run their own, on ports of their own, and leave nothing running.
# policy-rc.d answering 101 is Debian's way to say so to invoke-rc.d.
policy=/usr/sbin/policy-rc.d
added_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
  $SUDO chmod +x "$policy"
  added_policy=1
fi
status=0
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" || status=$?
[ $added_policy -eq 1 ] && $SUDO rm -f "$policy"
exit $status
