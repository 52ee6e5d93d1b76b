#!/usr/bin/env bash
# The wheel as a user gets it: packed from BUILD_DIR (scripts/build-wheel.sh
# --no-build), installed with `pip install --no-index` into a fresh
# virtualenv, and used from a PATH without the build tree: a 2-rank PyTorch
# (Gloo) job whose workers import ctrun, ctrund serving a 2-node job, and a
# C++ program built with find_package(ctrun) through ctrun.cmake_prefix_path()
# and run under the installed ctrun.
#
#   wheel_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build_dir=$(cd "$1" && pwd)
source_dir=$(cd "$2" && pwd)
# shellcheck source=tests/integration/script_support.sh
. "$(dirname "$0")/script_support.sh"

(cd "$source_dir" && CTRUN_BUILD_DIR=$build_dir scripts/build-wheel.sh \
  --no-build --out "$work/dist") || fail "the wheel was not built"
wheels=("$work"/dist/*.whl)
[ ${#wheels[@]} = 1 ] || fail "expected one wheel, got: ${wheels[*]}"
wheel=${wheels[0]}
echo "wheel: $(basename "$wheel") ($(du -h "$wheel" | cut -f1))"
version=$("$build_dir/launcher/ctrun" --version | awk '{print $2}')
[[ $(basename "$wheel") == ctrun-$version-py3-none-manylinux_2_*.whl ]] ||
  fail "the wheel's name does not carry version $version and a glibc tag"

# A fresh environment; torch comes from the system (Debian's python3-torch).
/usr/bin/python3 -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install --quiet --no-index "$wheel" ||
  fail "pip install --no-index refused the wheel"
venv=$work/venv
export PATH=$venv/bin:/usr/bin:/bin
unset PYTHONPATH
cd "$work"
[ "$(command -v ctrun)" = "$venv/bin/ctrun" ] || fail "ctrun is not the wheel's"
[ "$(command -v ctrund)" = "$venv/bin/ctrund" ] || fail "ctrund is not the wheel's"
[ "$(ctrun --version)" = "ctrun $version" ] || fail "ctrun --version: $(ctrun --version)"
[ "$(python -m ctrun --version)" = "ctrun $version" ] ||
  fail "python -m ctrun --version: $(python -m ctrun --version 2>&1)"
[ "$(ctrund --version)" = "ctrund $version" ] || fail "ctrund --version"
# The module outside ctrun: importable from the environment, inert.
module=$(python -c 'import ctrun; ctrun.heartbeat(); print(ctrun.__file__)')
[[ $module == $venv/lib/python3*/site-packages/ctrun/__init__.py ]] ||
  fail "import ctrun found $module"

# A 2-rank PyTorch job on Gloo whose workers import ctrun.
cat >"$work/train.py" <<'PY'
import ctrun
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.tensor([dist.get_rank() + 1.0])
for step in range(3):
    ctrun.heartbeat()
dist.all_reduce(t)
print("wheel rank %d of %d sum %d" % (dist.get_rank(), dist.get_world_size(), t.item()))
dist.destroy_process_group()
PY
out=$(timeout 180 ctrun --standalone --nproc_per_node=2 \
  --log_line_prefix_template= train.py 2>&1) || fail "the PyTorch job: $out"
[ "$(grep -c 'wheel rank [01] of 2 sum 3' <<<"$out")" = 2 ] ||
  fail "the PyTorch job's output: $out"

# The environment's ctrun run by its path, not activated (a batch script):
# its workers run under the environment's Python, as torchrun's would by
# its #! line. Fails before: /usr/bin/python3 ran them.
plan=$(env -u VIRTUAL_ENV PATH=/usr/bin:/bin "$venv/bin/ctrun" --dry_run \
  --nproc_per_node=1 train.py) || fail "--dry_run by path: $plan"
grep -qF "python: $venv/bin/python3 (from the environment ctrun is installed in)" \
  <<<"$plan" || fail "--dry_run by path names another Python: $plan"
cat >"$work/prefix.py" <<'PY'
import sys
print("worker prefix", sys.prefix)
PY
out=$(env -u VIRTUAL_ENV PATH=/usr/bin:/bin timeout 120 "$venv/bin/ctrun" \
  --standalone --nproc_per_node=1 --log_line_prefix_template= prefix.py 2>&1) ||
  fail "a job by the environment's ctrun's path: $out"
grep -qxF "worker prefix $venv" <<<"$out" ||
  fail "the workers of the environment's ctrun run another Python: $out"

# ctrund serving a 2-node job.
start_ctrund ctrund --listen=127.0.0.1:0
for node in 0 1; do
  timeout 120 ctrun --nnodes=2 --nproc_per_node=1 --rdzv_backend=c10d \
    --rdzv_endpoint="$endpoint" --rdzv_id=wheel \
    --local_addr=127.0.0.$((node + 2)) --log_line_prefix_template= \
    python -c 'import ctrun, os; print("wheel node rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"])' \
    >"$work/node$node.out" 2>&1 &
  eval "agent$node=\$!"
done
# shellcheck disable=SC2154
wait "$agent0" || fail "node 0: $(cat "$work/node0.out")"
# shellcheck disable=SC2154
wait "$agent1" || fail "node 1: $(cat "$work/node1.out")"
[ "$(cat "$work/node0.out" "$work/node1.out" | grep -c 'wheel node rank [01] of 2')" = 2 ] ||
  fail "the two-node job: $(cat "$work/node0.out" "$work/node1.out")"
stop_ctrund

# A C++ program against the installed CMake package.
prefix=$(python -c 'import ctrun; print(ctrun.cmake_prefix_path())')
cmake -S "$source_dir/tests/consumer" -B "$work/consumer" -G Ninja \
  -DCMAKE_PREFIX_PATH="$prefix" >/dev/null || fail "find_package(ctrun) via $prefix"
cmake --build "$work/consumer" >/dev/null || fail "the consumer did not build"
grep -q "$prefix" "$work/consumer/build.ninja" ||
  fail "the consumer did not link the wheel's library"
out=$(timeout 120 ctrun --nproc_per_node=2 --log_line_prefix_template= \
  "$work/consumer/consumer")
[ "$(grep -c 'consumer: rank [01] of 2' <<<"$out")" = 2 ] ||
  fail "the C++ program under the wheel's ctrun: $out"
echo "wheel test passed"
