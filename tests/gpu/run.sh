#!/usr/bin/env bash
# The GPU suite in one run, on a bare GPU machine without a network (tests/gpu/README.md):
#   bash tests/gpu/run.sh OUTDIR
# installs what the machine lacks from tests/gpu/wheels (tests/gpu/prepare_wheels.sh) and xrun from this tree,
# runs tests/gpu, and writes to OUTDIR: machine.txt, install.log, pytest.log, junit.xml, results.json, results.md.
# Everything ends within BUDGET seconds (default 240) of the start.
set -u
OUT=${1:?usage: tests/gpu/run.sh OUTDIR}
BUDGET=${BUDGET:-240}
START=$(date +%s)
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-python3}
SITE=${XRUN_GPU_SITE:-/tmp/xrun-gpu-site}
mkdir -p "$OUT"
cd "$REPO" || exit 1

show() { echo "\$ $*"; timeout 30 "$@" 2>&1; echo; }
{
  date -u; show uname -a; show nvidia-smi; show nvidia-smi -L; show nvidia-smi topo -m
  show nvidia-smi --query-gpu=index,pci.bus_id,uuid,name,memory.total,driver_version,mig.mode.current --format=csv
  show ls -l /proc/driver/nvidia/gpus /dev/nvidiactl; show cat /proc/driver/nvidia/version
  for info in /proc/driver/nvidia/gpus/*/information; do show cat "$info"; done
  for bus in $(ls /proc/driver/nvidia/gpus 2>/dev/null); do
    show cat "/sys/bus/pci/devices/$bus/numa_node" "/sys/bus/pci/devices/$bus/local_cpulist"
  done
  show ls /sys/devices/system/node; show which numactl py-spy; show "$PY" -c "import torch, sys; print(sys.version, torch.__version__, torch.version.cuda, torch.cuda.is_available())"
} > "$OUT/machine.txt" 2>&1

# Only the wheels the machine lacks: a second copy of a package it has (pytest's plugins there) could break it.
{
  missing=$("$PY" - tests/gpu/wheels <<'PY'
import os, sys
from importlib import metadata
folder = sys.argv[1]
for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
    if name.endswith(".whl"):
        try:
            print(f"have {name.split('-')[0]} {metadata.version(name.split('-')[0])}", file=sys.stderr)
        except metadata.PackageNotFoundError:
            print(os.path.join(folder, name))
PY
  )
  rm -rf "$SITE"; mkdir -p "$SITE"
  if [ -n "$missing" ]; then
    echo "installing: $missing"
    # shellcheck disable=SC2086
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" $missing
  fi
  # xrun itself from this tree, as a user's pip would (setuptools from the machine: no build isolation)
  if "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --target "$SITE" .; then
    echo "xrun installed into $SITE"
  else
    echo "XRUN NOT INSTALLED: pip failed above; the suite runs xrun from the tree (PYTHONPATH)"
    export XRUN_GPU_FROM_TREE=1
  fi
} > "$OUT/install.log" 2>&1
export PYTHONPATH="$SITE${XRUN_GPU_FROM_TREE:+:$REPO/src}"
export PATH="$SITE/bin:$PATH" XRUN_GPU_RESULTS="$OUT" PYTHONUNBUFFERED=1
(cd /tmp && "$PY" -c "import xrun, sys; print('xrun for subprocesses:', xrun.__file__)") >> "$OUT/install.log" 2>&1
tail -3 "$OUT/install.log"

left=$(( BUDGET - ($(date +%s) - START) - 5 ))
(( left < 60 )) && left=60  # a slow install still leaves the suite a minute: its first tests say the most
echo "install took $(( $(date +%s) - START )) s; the suite gets ${left} s"
timeout --kill-after=5 "$left" "$PY" -m pytest tests/gpu -p no:cacheprovider -rA -v \
  --junitxml="$OUT/junit.xml" > "$OUT/pytest.log" 2>&1
code=$?
[ "$code" = 124 ] && echo "THE SUITE RAN OUT OF ITS ${left} s: the tests not finished show as 'not run'" | tee -a "$OUT/pytest.log"
tail -40 "$OUT/pytest.log"
echo "run.sh: $(( $(date +%s) - START )) s in all; results in $OUT/results.md"
exit "$code"
