"""The fuzz tier (issue 12): generated hostfiles, selection specs, numeric flags, env files and argument bytes
through xrun's command-line entry. Whatever comes in: exit 0 or 2, never a traceback, a one-line error for
exit 2, a time bound per example; and an input ``--dry-run`` accepts never fails the real run.

In-process (``xrun.runner.cli.main``) for volume, a real subprocess for a smaller sample. Runs in the fast
tier (marker ``fuzz`` to select or skip it); the whole module takes well under a minute on 2 cores.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT, run_xrun
from xrun.common.spec import parse_module_list
from xrun.errors import UsageError
from xrun.joined.entry import main
from xrun.runner.cli import build_parser

pytestmark = pytest.mark.fuzz

TWO_WORKERS = os.path.join(ROOT, "hostfiles", "two-workers")
SCALE = int(os.environ.get("XRUN_FUZZ_SCALE", "1"))  # e.g. 20 for a longer hunt by hand
FAST = settings(max_examples=120 * SCALE, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
SUBPROCESS = settings(max_examples=12 * SCALE, deadline=20_000, suppress_health_check=[HealthCheck.too_slow])
SCRATCH = tempfile.mkdtemp(prefix="xrun-fuzz-")


def run_main(*args: str) -> tuple[int, str]:
    """``main`` in-process: its exit code and stderr (stdout is dropped: only dry runs get here)."""
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(list(args))
    return code, err.getvalue()


def assert_contract(code: int, stderr: str) -> None:
    assert code in (0, 2), (code, stderr)
    assert "Traceback" not in stderr, stderr
    if code == 2:
        lines = [line for line in stderr.splitlines() if line.startswith("xrun")]
        assert len(lines) == 1 and stderr.endswith("\n") and stderr.count("\n") == 1 + stderr.count("xrun: ignoring")
        assert "\n" not in lines[0]


def write(name: str, data: bytes) -> str:
    path = os.path.join(SCRATCH, name)
    with open(path, "wb") as handle:
        handle.write(data)
    return path


# Hostfile-ish text: real lines, ranges, keys and noise, so that generated files get past the first check.
HOST_TOKEN = st.one_of(
    st.sampled_from(["localhost", "worker-0", "worker-1", "n[0-3]", "n[01-10]", "a..b", ".", "x" * 70, "h@x",
                     "node[0-99999999999]", "n[1,1]", "n[3-1]", "\ufeffw", "w\u0663", "zz-\u202e", "a\x00b"]),
    st.text(min_size=1, max_size=12),
)
SLOTS = st.one_of(st.sampled_from(["slots=1", "slots=4", "slots=0", "slots=1024", "slots=1025", "slots=\u0663",
                                   "slots=99999999999999999999", "slots=", "max_slots=2", "#c"]),
                  st.text(max_size=10))
LINE = st.tuples(HOST_TOKEN, st.lists(SLOTS, max_size=2)).map(lambda t: " ".join([t[0], *t[1]]))
HOSTFILE = st.lists(LINE, max_size=6).map("\n".join)


@FAST
@given(text=HOSTFILE, bom=st.booleans(), encoding=st.sampled_from(["utf-8", "utf-16", "latin-1"]))
def test_hostfile_text(text, bom, encoding):
    data = (("\ufeff" if bom else "") + text).encode(encoding, errors="replace")
    assert_contract(*run_main("--dry-run=json", "-H", write("hf", data), "t.py"))


SPEC = st.one_of(
    st.sampled_from(["worker-0", "worker-0:0,1", "worker-1:3@worker-0", "w:", "@", "worker-0:\u0663", ":1",
                     "worker-0:99999999999999999999", "worker-0:0:1", "worker-0,worker-1", "--"]),
    st.text(max_size=20),
)


@FAST
@given(flag=st.sampled_from(["-i", "-e", "--num_nodes", "--num_gpus"]), spec=SPEC)
def test_selection_specs(flag, spec):
    assert_contract(*run_main("--dry-run", "-H", TWO_WORKERS, f"{flag}={spec}", "t.py"))


NUMERIC_FLAGS = ["--num_nodes", "--num_gpus", "--master_port", "--shutdown_timeout", "--join_timeout", "--fanout",
                 "--ssh_port", "--control_port", "--node_rank", "--max_restarts", "--min_nodes", "--max_nodes",
                 "--monitor_interval"]
NUMBER = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", "inf", "-inf", "1e308", "\u0663", "\u00b2", "1_000", "0x10", " 5 ", "", "+3", "٣.5", "--"]),
    st.text(max_size=8),
)


@FAST
@given(flag=st.sampled_from(NUMERIC_FLAGS), value=NUMBER, remote=st.booleans())
def test_numeric_flags(flag, value, remote):
    elastic = ["--elastic"] if flag in ("--max_restarts", "--min_nodes", "--max_nodes", "--monitor_interval") else []
    hosts = ["-H", TWO_WORKERS] if remote else []
    assert_contract(*run_main("--dry-run", *hosts, *elastic, f"{flag}={value}", "t.py"))


# Flags whose value is a small language of its own: each parser must refuse what it cannot read in one line.
STRING_FLAGS = {  # flag -> what it needs beside it to be read at all
    "--console_ranks": [], "--forward_signals": [], "--bind_core_list": ["--bind_cores_to_rank"],
    "--export": ["-H", TWO_WORKERS], "--network_interface": ["-H", TWO_WORKERS], "--hosts": [],
    "--hang_action": ["--hang_timeout", "5"], "--platform": [], "--run_id": [], "--master_addr": [],
    "--control_addr": ["-H", TWO_WORKERS], "--launcher_args": ["-H", TWO_WORKERS, "--launcher", "openmpi"],
    "--nnodes": ["--elastic"], "--rdzv_conf": ["--elastic"], "--rdzv_endpoint": ["--elastic"],
    "--rdzv_backend": ["--elastic"], "--preload": [],
    # torchrun's (issue 41); the dashed spellings of the rendezvous flags: a static job's, without --elastic
    "--local-ranks-filter": [], "--tee": [], "--redirects": [], "--role": [], "--signals-to-handle": [],
    "--local-addr": [], "--nproc-per-node": [], "--rdzv-endpoint": [], "--rdzv-backend": [], "--rdzv-id": [],
    "--rdzv-conf": [], "--start-method": [], "--numa-binding": [], "--duplicate-stdout-filters": [],
}
STRING_VALUE = st.one_of(
    st.sampled_from(["0-99999999999", "\u00b2", "\u0663", "--", "", " ", "a\nb", "0,0", "1-0", "0-", "-1", "x" * 5000,
                     "USR1,USR1", "RTMIN", "0-1,0-1", "A=1", "A", "=", "A B=1", "eth0", "auto", "none", "lo",
                     "n[0-3]", "n[0-99999999999]", "1:2", "2:1", ":", "h:1", "[::1]:1", "k=v,k=v", "\udcff"]),
    st.text(alphabet="0123456789-,:=[]@ .aAUSR\u0663\u00b2", max_size=14),
    st.text(max_size=10),
)


@FAST
@given(flag=st.sampled_from(sorted(STRING_FLAGS)), value=STRING_VALUE)
def test_string_flags(flag, value):
    assert_contract(*run_main("--dry-run", *STRING_FLAGS[flag], f"{flag}={value}", "t.py"))


# --preload's module lists (issue 32): names import takes, found here or not, among paths, spaces and noise.
MODULE_NAME = st.one_of(
    st.sampled_from(["json", "os.path", "xml.etree", "no_such_mod_xyz", "json.nope", "_x", "\u00e9t\u00e9", "\u0663",
                     "1a", "a-b", "", ".", "a..b", "a.", ".a", "a/b", "C:\\x", "x.py", "x.so", "x.pyc", "class",
                     "\x00", "a b", "\ufb01", "\udcff", "x" * 300]),
    st.text(alphabet="abz_.,/\\ 1\u00e9\u0663-", max_size=10),
    st.text(max_size=6),
)


@FAST
@given(names=st.lists(MODULE_NAME, max_size=4))
def test_preload_module_lists(names):
    """A list either reads as its names, each a dotted identifier, in order with repeats dropped, and reads back the
    same; or is refused in one line naming --preload. Through the dry run, which looks each name up: exit 0, or 2
    in one line."""
    text = ",".join(names)
    try:
        modules = parse_module_list("--preload", text)
    except UsageError as refused:
        assert str(refused).startswith("--preload: ") and "\n" not in str(refused)
    else:
        assert modules == tuple(dict.fromkeys(text.split(",")))
        assert all(part.isidentifier() for name in modules for part in name.split("."))
        assert parse_module_list("--preload", ",".join(modules)) == modules
    assert_contract(*run_main("--dry-run", f"--preload={text}", "t.py"))


ENV_LINE = st.one_of(
    st.sampled_from(["A=1", "export B='x y'", 'C="a\\nb"', "D=#x", "HOME=/x", "1X=2", "E='open", 'F="bad\\q"',
                     "G=a b # c", "\ufeffH=1", "I=\x00", "=v", "export"]),
    st.text(max_size=20),
)


@FAST
@given(lines=st.lists(ENV_LINE, max_size=5), raw=st.binary(max_size=40))
def test_env_files(lines, raw):
    home = os.path.join(SCRATCH, "home")
    os.makedirs(home, exist_ok=True)
    with open(os.path.join(home, ".xrun_env"), "wb") as handle:
        handle.write("\n".join(lines).encode("utf-8", "surrogateescape") + raw)
    with mock.patch.dict(os.environ, {"HOME": home}):
        assert_contract(*run_main("--dry-run", "-H", TWO_WORKERS, "t.py"))


ARG = st.binary(max_size=16).map(os.fsdecode)


@FAST
@given(before=st.lists(ARG, max_size=3), after=st.lists(ARG, max_size=4))
def test_argument_bytes(before, after):
    code, stderr = run_main("--dry-run", *before, "t.py", *after)
    assert_contract(code, stderr)
    if not before:
        assert code == 0, stderr  # the script's own arguments are never xrun's business


KNOWN_FLAGS = frozenset(option for action in build_parser()._actions for option in action.option_strings)
UNKNOWN_FLAG = st.one_of(
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz_-", min_size=1, max_size=14).map(lambda name: "--" + name),
    st.sampled_from(["--num-gpu", "--nnode", "--lr", "--num_gpu", "--hostf", "--master", "-x", "-1", "--\u0663",
                     "--a\nb", "--" + "n" * 5000]),
).filter(lambda flag: flag.split("=", 1)[0] not in KNOWN_FLAGS and flag[:2] not in KNOWN_FLAGS)


@FAST
@given(flag=UNKNOWN_FLAG, value=st.one_of(st.none(), st.sampled_from(["2", "x", "-3", "t.py"]), ARG),
       attached=st.booleans(), known=st.sampled_from([[], ["--num_gpus", "1"], ["-H", TWO_WORKERS]]))
def test_unknown_flags_are_one_line_naming_them(flag, value, attached, known):
    """A flag xrun does not have, before the script, with or without a value: exit 2, one line naming it."""
    words = [flag] if value is None else [f"{flag}={value}"] if attached and flag.startswith("--") else [flag, value]
    code, stderr = run_main("--dry-run", *known, *words, "t.py", "--lr", "1")
    assert_contract(code, stderr)
    assert code == 2, stderr
    assert stderr.startswith("xrun: unknown flag "), stderr


@SUBPROCESS
@given(args=st.lists(st.binary(min_size=1, max_size=12).filter(lambda b: b"\0" not in b).map(os.fsdecode),
                     max_size=3))
def test_argument_bytes_through_a_real_xrun(args):
    result = run_xrun("--dry-run", *args, "t.py", *args, env={"PYTHONIOENCODING": "utf-8"}, timeout=20)
    assert_contract(result.returncode, result.stderr)


# -- what --dry-run accepts, the real run runs --------------------------------------------------------------

LOCAL_OPTIONS = st.lists(
    st.one_of(
        st.sampled_from([["--no_prefix"], ["--quiet"], ["--no_local_rank"], ["--master_port", "0"]]),
        st.tuples(st.just("--num_gpus"), st.sampled_from(["1", "2", "0", "\u0663", "1025"])).map(list),
        st.tuples(st.just("--shutdown_timeout"), NUMBER).map(list),
        st.tuples(st.just("--log_dir"), st.sampled_from(["logs", "/dev/null", "/proc/x", "a/b/c", "\udcff"])).map(list),
        st.tuples(st.just("--python"), st.sampled_from(["python3", "/nonexistent", "README.md"])).map(list),
        # --elastic with an endpoint torch could not use (issue 37 §3: a name that does not resolve hung 125 s);
        # all refused by the dry run, so no elastic run starts here
        st.tuples(st.just("--elastic"), st.just("--rdzv_endpoint"),
                  st.sampled_from(["no-such-host.invalid", "no-such-host.invalid:29400", "[no::such]:1", "[::1]:0",
                                   "[::1", "::1:29400", "localhost:", "localhost:99999"])).map(list),
    ),
    max_size=3,
)


# What SCRIPT can be, runnable or not: a file, a directory with or without __main__.py, a package with or without
# __main__ for --module, a program whose #! interpreter is there or not for --no_python.
SCRIPTS = st.sampled_from([["ok.py"], ["app"], ["bare"], ["--module", "app"], ["--module", "bare"],
                           ["--no_python", "./tool"], ["--no_python", "./broken"]])


def _script_kinds(cwd: str) -> None:
    files = {"ok.py": "pass\n", "app/__init__.py": "", "app/__main__.py": "pass\n", "bare/__init__.py": "",
             "tool": "#!/bin/sh\nexit 0\n", "broken": "#!/nonexistent/sh\nexit 0\n"}
    for name, text in files.items():
        os.makedirs(os.path.join(cwd, os.path.dirname(name)), exist_ok=True)
        with open(os.path.join(cwd, name), "w") as handle:
            handle.write(text)
    for name in ("tool", "broken"):
        os.chmod(os.path.join(cwd, name), 0o755)


@SUBPROCESS
@given(options=LOCAL_OPTIONS, script=SCRIPTS, arg=ARG.filter(lambda a: "\0" not in a))
def test_dry_run_accepted_means_the_run_starts(options, script, arg):
    flat = [item for option in options for item in option]
    cwd = tempfile.mkdtemp(dir=SCRATCH)
    _script_kinds(cwd)
    dry = run_xrun("--dry-run", *flat, *script, arg, cwd=cwd, timeout=20)
    assert_contract(dry.returncode, dry.stderr)
    if dry.returncode != 0:
        return
    real = run_xrun(*flat, *script, arg, cwd=cwd, timeout=60)
    assert real.returncode == 0, real.stderr
    assert "Traceback" not in real.stderr
