"""``--preload`` on a GPU (issue 32): a CUDA rank forked from the helper that imported torch (which must not have
started CUDA: it asks NVML) initialises CUDA itself and computes on its device, one rank per GPU; a module whose
real import initialises CUDA is refused in one line, exit code 2, before any rank starts."""

from __future__ import annotations

import re

from tests.gpu.runs import explain, job, records, run, xrun_argv
from tests.gpu.smi import parse_list, smi


def test_cuda_ranks_forked_from_a_torch_helper_use_their_gpus(tmp_path, figures):
    listed = parse_list(smi("-L"))
    done = run(xrun_argv("--num_gpus", str(len(listed)), "--preload", "torch", script=job("cuda_rank.py")),
               cwd=str(tmp_path), timeout=120)
    assert done.returncode == 0, explain(done)
    ranks = records(done.stdout)
    said = re.search(r"preloaded torch in ([0-9.]+) s", done.stderr)
    figures.put("import_s", float(said.group(1)) if said else None)
    figures.put("ranks", [{k: r[k] for k in ("rank", "device", "uuid", "matmul_ok", "preloaded", "bad_fork")}
                          for r in ranks])
    assert said, explain(done)
    assert len(ranks) == len(listed)
    assert all(r["preloaded"] and not r["bad_fork"] and r["matmul_ok"] for r in ranks), ranks
    assert [r["device"] for r in ranks] == [r["local_rank"] for r in ranks]


def test_a_module_whose_import_initialises_cuda_is_refused_before_any_rank(tmp_path, figures):
    done = run(xrun_argv("--preload", "cuda_at_import", script=job("cuda_rank.py")), cwd=str(tmp_path), timeout=120)
    figures.put("stderr", done.stderr.strip())
    assert done.returncode == 2, explain(done)
    assert done.stderr.strip().splitlines() == [
        "xrun: --preload: importing 'cuda_at_import' initialised CUDA, and a rank forked after that cannot use the "
        "GPU (\"Cannot re-initialize CUDA in forked subprocess\"): leave 'cuda_at_import' out of --preload"], explain(done)
    assert records(done.stdout) == []
