"""pdsh's lines about sessions xrun's own stop ended (xrun.runner.backends.echoes, xrun.runner.job.stop): which
ones only echo the stop, and how they are kept off the console while everything else passes at once. Pure; the
real pdsh is tests/cluster/test_multinode.py's."""

import signal

import pytest

from xrun.runner.backends.echoes import EchoFilter, exit_line
from xrun.runner.job.config import JobConfig
from xrun.runner.job.events import AgentError, Done, HelloReceived, RankExited, Ready, SignalReceived
from xrun.runner.job.machine import Job

CONFIG = JobConfig(hosts=("a", "b", "c"), join_timeout=30.0, shutdown_timeout=10.0, world_size=3)
STARTED = [*(HelloReceived(n, n, addr=f"10.0.0.{n}", peer=f"10.0.0.{n}", xrun_version=None) for n in range(3)),
           Ready(0, 29501), Ready(1), Ready(2)]


def job_after(*events):
    job = Job(CONFIG, now=0.0)
    for event in (*STARTED, *events):
        job.handle(event, 1.0)
    return job


def test_the_exit_line_parsed():
    assert exit_line(b"pdsh@head: node2: ssh exited with exit code 143") == ("node2", 143)
    assert exit_line(b"pdsh@head: node2: ssh exited with exit code 255\r") == ("node2", 255)
    assert exit_line(b"pdsh@head: node2: connect: Connection refused") is None
    assert exit_line(b"[node2:0] pdsh@head: node2: ssh exited with exit code 143") is None


def test_nothing_is_an_echo_before_the_stop():
    job = job_after()
    assert not job.stop.echoed("b", 143) and not job.stop.echoed("b", 130)


def test_after_a_failure_the_stop_codes_and_the_reported_code_are_echoes_but_never_255():
    job = job_after(RankExited(1, rank=1, local_rank=0, code=1), Done(1, 1), Done(0, 143))
    assert job.stop.echoed("a", 143) and job.stop.echoed("c", 143)  # stopped by xrun's SIGTERM
    assert job.stop.echoed("b", 1)  # the failing node's own code: its agent reported it on the channel
    assert not job.stop.echoed("c", 1)  # c reported nothing yet: a code of its own is news
    assert not job.stop.echoed("a", 255) and not job.stop.echoed("b", 255)  # ssh's own failure, always shown


def test_the_code_of_a_nodes_refusal_before_the_start_is_an_echo():
    # issue 33 §2: b's preflight refused (an error with exit code 2): "ssh exited with exit code 2" only repeats it
    job = job_after(AgentError(1, "--log_dir 'logs/b/rank1/stdout.log': is a symbolic link", 2))
    assert job.stop.echoed("b", 2)
    assert not job.stop.echoed("c", 2) and not job.stop.echoed("b", 255)


@pytest.mark.parametrize("code", [130, 137, 143])
def test_after_ctrl_c_the_signal_codes_are_echoes(code):
    job = job_after(SignalReceived(int(signal.SIGINT)))
    assert job.stop.echoed("a", code)


def never(host, code):
    return False


def always(host, code):
    return code != 255


def test_echoes_are_dropped_and_every_other_line_passes():
    said = []

    def judge(host, code):
        said.append((host, code))
        return code == 143

    data = (b"[a:0] hello\n"
            b"pdsh@head: a: ssh exited with exit code 143\n"
            b"pdsh@head: c: ssh exited with exit code 255\n"
            b"ssh: connect to host c port 22: Connection refused\n"
            b"pdsh@head: b: connect: Connection refused\n")
    shown = EchoFilter().feed(data, judge)
    assert shown == (b"[a:0] hello\npdsh@head: c: ssh exited with exit code 255\n"
                     b"ssh: connect to host c port 22: Connection refused\npdsh@head: b: connect: Connection refused\n")
    assert said == [("a", 143), ("c", 255)]


def test_only_what_may_become_a_pdsh_line_is_held():
    echoes = EchoFilter()
    assert echoes.feed(b"[a:0] 40%|####", always) == b"[a:0] 40%|####"  # a progress bar: at once
    assert echoes.feed(b"\r[a:0] 50%|#####\n", always) == b"\r[a:0] 50%|#####\n"
    assert echoes.feed(b"pd", always) == b""  # may still become pdsh's line
    assert echoes.feed(b"sh@head: b: ssh exited", always) == b""
    assert echoes.feed(b" with exit code 143\n[b:1] after\n", always) == b"[b:1] after\n"
    assert echoes.feed(b"pdx not pdsh\n", always) == b"pdx not pdsh\n"
    assert echoes.feed(b"pdsh@head: b: ssh exited with exit code 143\n", never) == \
        b"pdsh@head: b: ssh exited with exit code 143\n"
    assert echoes.feed(b"pdsh@he", always) == b"" and echoes.flush() == b"pdsh@he"  # the stream ended: written


def test_a_line_that_only_starts_mid_line_is_not_taken():
    echoes = EchoFilter()
    assert echoes.feed(b"[a:0] partial ", always) == b"[a:0] partial "
    assert echoes.feed(b"pdsh@head: b: ssh exited with exit code 143\n", always) == \
        b"pdsh@head: b: ssh exited with exit code 143\n"  # a rank's line that happens to say it
