#!/usr/bin/env bash
# Prepare, on a machine with a network, the wheels tests/gpu/run.sh installs on a GPU machine that has none:
# xrun's dependencies that the GPU image may lack, for CPython 3.12 on manylinux x86_64. They land in
# tests/gpu/wheels/ (git-ignored; the device call carries it). Run it in the checkout the device call sends.
set -euo pipefail
cd "$(dirname "$0")"
rm -rf wheels
mkdir -p wheels
# xrun's install_requires (psutil, py-spy, cryptography and cryptography's cffi and pycparser), the gpu extra
# (nvidia-ml-py), and pytest with its own needs; run.sh installs only those the machine lacks.
WHEELS=(
  psutil==7.2.2 py-spy==0.4.3 cryptography==48.0.0 cffi==2.0.0 pycparser==3.0 nvidia-ml-py==13.615.71
  pytest==9.0.3 pluggy==1.6.0 iniconfig==2.3.0 packaging==26.2 pygments==2.19.2
)
PLATFORMS=()
for p in manylinux_2_34_x86_64 manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux_2_5_x86_64 manylinux1_x86_64; do
  PLATFORMS+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" -d wheels "${WHEELS[@]}"
ls -1 wheels
size=$(du -sk wheels | cut -f1)
echo "wheels: ${size} KiB"
# the device call sends the working tree (tracked and untracked-not-ignored files) plus the carried paths: 64 MiB
tree=$(cd ../.. && git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
total=$(( tree / 1024 + size ))
echo "working tree + wheels: ${total} KiB of 65536"
if (( total > 60000 )); then
  echo "too large for one device call (64 MiB with the tree): remove what the tree need not send" >&2
  exit 1
fi
