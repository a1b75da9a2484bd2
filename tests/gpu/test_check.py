"""``xrun check`` on the node reports the GPU: name, memory, driver."""

from __future__ import annotations

import sys

from tests.gpu.runs import explain, run
from tests.gpu.smi import QUERY_GPU, parse_query_gpu, smi


def test_xrun_check_reports_the_gpu(tmp_path, figures):
    queried = parse_query_gpu(smi(QUERY_GPU, "--format=csv,noheader,nounits"))
    done = run([sys.executable, "-m", "xrun", "check"], cwd=str(tmp_path), timeout=60)
    figures.put("xrun check", done.stdout.strip().splitlines())
    assert done.returncode == 0, explain(done)
    row = done.stdout.splitlines()[1]
    first = queried[0]
    assert f"{len(queried)}x {first.name} {first.memory_mib} MiB, driver {first.driver}" in row, row
    assert f"{len(queried)}/{len(queried)}" in row, row
