#!/usr/bin/env bash
# A user's project built with find_package(ctrun) against installed ctrun,
# then run under the installed ctrun.
#
#   consumer_test.sh BUILD_DIR SOURCE_DIR         `cmake --install` to a prefix
#   consumer_test.sh --deb BUILD_DIR SOURCE_DIR   cpack's .deb, unpacked with
#       dpkg -x into a scratch root: its files, control data, man pages and
#       service are checked, and the service's own command line serves a job
set -euo pipefail
deb=0
if [ "${1:-}" = --deb ]; then
  deb=1
  shift
fi
build_dir=$1
source_dir=$2
# shellcheck source=tests/integration/script_support.sh
. "$(dirname "$0")/script_support.sh"

if [ $deb = 0 ]; then
  prefix=$work/prefix
  cmake --install "$build_dir" --prefix "$prefix" >/dev/null
  # The service's files are the package's alone.
  [ ! -e "$prefix/lib/systemd/system/ctrund.service" ] ||
    fail "a prefix install wrote the systemd unit"
else
  cpack --config "$build_dir/CPackConfig.cmake" -B "$work/pkg" >/dev/null ||
    fail "cpack failed"
  debs=("$work"/pkg/*.deb)
  [ ${#debs[@]} = 1 ] || fail "expected one .deb, got: ${debs[*]}"
  package=${debs[0]}
  echo "package: $(basename "$package")"
  [ "$(dpkg-deb -f "$package" Package)" = ctrun ] || fail "package not named ctrun"
  # Dependencies come from dpkg-shlibdeps: the libraries ctrun links.
  depends=$(dpkg-deb -f "$package" Depends)
  echo "Depends: $depends"
  for lib in libc6 libgrpc++ libprotobuf libgloo; do
    grep -q "$lib" <<<"$depends" || fail "Depends lacks $lib"
  done

  root=$work/root
  dpkg -x "$package" "$root"
  # The library directory is the build's (lib, or lib/MULTIARCH).
  libdir=$(cd "$root" && dirname "$(find usr/lib -name 'libctrun_worker.so*' | head -1)")
  for f in usr/bin/ctrun usr/bin/ctrund \
    "$libdir/libctrun_worker.so" "$libdir/cmake/ctrun/ctrunConfig.cmake" \
    usr/include/ctrun/worker.h usr/include/ctrun/progress.h \
    usr/share/man/man1/ctrun.1.gz usr/share/man/man1/ctrund.1.gz \
    usr/share/doc/ctrun/examples/train.cc \
    usr/lib/systemd/system/ctrund.service etc/default/ctrund; do
    [ -e "$root/$f" ] || fail "the package lacks /$f"
  done
  [ ! -e "$root/usr/bin/train" ] || fail "the example trainer is on the PATH"
  # Man pages are made from --help: every flag is in them.
  for flag in --state-dir --metrics-listen --token-file; do
    zcat "$root/usr/share/man/man1/ctrund.1.gz" | grep -q -- "${flag//-/\\\\-}" ||
      fail "ctrund(1) does not mention $flag"
  done
  zcat "$root/usr/share/man/man1/ctrun.1.gz" | grep -q 'nproc\\\?_per\\\?_node' ||
    fail "ctrun(1) does not mention --nproc_per_node"

  # Control files: the settings are a conffile; the scripts parse.
  dpkg-deb -e "$package" "$work/control"
  grep -qx /etc/default/ctrund "$work/control/conffiles" ||
    fail "/etc/default/ctrund is not a conffile"
  for script in postinst prerm postrm; do
    [ -x "$work/control/$script" ] || fail "$script missing or not executable"
    sh -n "$work/control/$script" || fail "$script does not parse"
  done
  # postinst makes the token once, for root only; a second run keeps it.
  DPKG_ROOT=$root "$work/control/postinst" configure
  token_file=$root/etc/ctrun/token
  [ "$(stat -c %a "$token_file")" = 600 ] || fail "token file mode $(stat -c %a "$token_file")"
  grep -qxE '[0-9a-f]{48}' "$token_file" || fail "token is not 48 hex digits"
  first=$(cat "$token_file")
  DPKG_ROOT=$root "$work/control/postinst" configure
  [ "$(cat "$token_file")" = "$first" ] || fail "a second postinst changed the token"

  # The unit as systemd reads it.
  unit=$root/usr/lib/systemd/system/ctrund.service
  if command -v systemd-analyze >/dev/null; then
    # It resolves ExecStart's binary in the real root; only that is excused.
    out=$(systemd-analyze verify --man=no "$unit" 2>&1) || true
    if grep -v 'ctrund is not executable\|Command /usr/bin/ctrund' <<<"$out" |
      grep -q .; then
      fail "systemd-analyze verify: $out"
    fi
  fi
  # The unit's command line, with the settings file's values, serves a job:
  # systemd's paths stand for those in the scratch root and the listening
  # address is one on loopback.
  exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
  # shellcheck disable=SC1090,SC1091
  (. "$root/etc/default/ctrund" && [ -n "$CTRUND_LISTEN" ]) ||
    fail "/etc/default/ctrund sets no CTRUND_LISTEN"
  mkdir -p "$work/state"
  command_line=${exec_start//\/usr\/bin\/ctrund/$root/usr/bin/ctrund}
  command_line=${command_line//\$\{CTRUND_LISTEN\}/127.0.0.1:0}
  command_line=${command_line//\/var\/lib\/ctrund/$work/state}
  command_line=${command_line//%d\/token/$token_file}
  command_line=${command_line//\$CTRUND_OPTS/}
  grep -q '[$%]' <<<"$command_line" && fail "unsubstituted: $command_line"
  # shellcheck disable=SC2086
  start_ctrund $command_line
  prefix=$root/usr
fi

cmake -S "$source_dir/tests/consumer" -B "$work/build" -G Ninja \
  -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/build" >/dev/null
# Outside a launch it explains itself...
set +e
"$work/build/consumer"
code=$?
set -e
[ "$code" = 3 ] || fail "expected exit 3 outside ctrun, got $code"
# ...and under the installed ctrun it knows its rank.
out=$(timeout 120 "$prefix/bin/ctrun" --nproc_per_node=2 \
  --log_line_prefix_template= "$work/build/consumer")
echo "$out"
[ "$(grep -c 'consumer: rank [01] of 2' <<<"$out")" = 2 ] || fail "standalone run"
if [ $deb = 1 ]; then
  # Two nodes' agents meet at the service's daemon, with its token.
  for node in 0 1; do
    timeout 120 "$prefix/bin/ctrun" --nnodes=2 --nproc_per_node=1 \
      --rdzv_backend=c10d --rdzv_endpoint="$endpoint" --rdzv_id=deb \
      --rdzv_conf=token_file="$token_file" --local_addr=127.0.0.$((node + 2)) \
      --log_line_prefix_template= "$work/build/consumer" \
      >"$work/node$node.out" 2>&1 &
    eval "agent$node=\$!"
  done
  # shellcheck disable=SC2154
  wait "$agent0" || fail "node 0: $(cat "$work/node0.out")"
  # shellcheck disable=SC2154
  wait "$agent1" || fail "node 1: $(cat "$work/node1.out")"
  cat "$work/node0.out" "$work/node1.out" | grep 'consumer: rank'
  [ "$(cat "$work/node0.out" "$work/node1.out" | grep -c 'consumer: rank [01] of 2')" = 2 ] ||
    fail "the two-node job through the service's daemon"
  # Without the token it is refused.
  if timeout 60 "$prefix/bin/ctrun" --nnodes=1 --rdzv_backend=c10d \
    --rdzv_endpoint="$endpoint" --rdzv_id=notoken "$work/build/consumer" \
    >"$work/refused.out" 2>&1; then
    fail "a job without the token was served"
  fi
  grep -qi token "$work/refused.out" || fail "refusal does not name the token: $(cat "$work/refused.out")"
fi
echo "consumer test passed"
