"""The hang doctor on a rank busy in CUDA work: Ctrl-\\ (SIGQUIT) gives its Python stack and the job goes on."""

from __future__ import annotations

import signal
import subprocess
import time

from tests.gpu.runs import clean_env, job, records, xrun_argv
from tests.gpu.smi import parse_list, smi


def test_sigquit_shows_the_stack_of_a_rank_in_cuda_work(tmp_path, figures):
    count = len(parse_list(smi("-L")))  # one rank per GPU
    argv = xrun_argv("--log_dir", str(tmp_path / "logs"), "--num_gpus", str(count), script=job("busy_rank.py"))
    proc = subprocess.Popen(argv, cwd=str(tmp_path), env=clean_env({"BUSY_SECONDS": "8"}), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        lines = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if not line or sum("XRUN_GPU_UP" in seen for seen in lines) == count:
                break
        assert sum("XRUN_GPU_UP" in line for line in lines) == count, lines
        time.sleep(1.0)  # well inside the loop of matmuls
        asked = time.monotonic()
        proc.send_signal(signal.SIGQUIT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stack_lines = [line for line in err.splitlines() if "SIGQUIT" in line or "busy_cuda_work" in line]
    figures.put("stack lines", stack_lines)
    figures.put("seconds from SIGQUIT to the job's end", round(time.monotonic() - asked, 2))
    assert proc.returncode == 0, err
    assert any("busy_cuda_work" in line for line in stack_lines), err
    ranks = records("".join(lines) + out)
    figures.put("steps per rank", [r["steps"] for r in ranks])
    assert len(ranks) == count and all(r["steps"] > 0 for r in ranks)
