import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xrun.errors import HostfileError
from xrun.runner.hosts.hostfile import parse_hostfile, read_hostfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize(
    "text, expected",
    [
        ("worker-1 slots=4\n", {"worker-1": (0, 1, 2, 3)}),
        ("a slots=1\nb slots=2\n", {"a": (0,), "b": (0, 1)}),
        ("# comment\n\n  a slots=2  \n", {"a": (0, 1)}),
        ("a slots=2 # trailing comment\n", {"a": (0, 1)}),
        ("b slots=1\na slots=1\n", {"b": (0,), "a": (0,)}),  # file order is node order
        ("node[01-03,07] slots=8\n", {f"node0{i}": tuple(range(8)) for i in (1, 2, 3, 7)}),
        ("a\tslots=3\r\n", {"a": (0, 1, 2)}),
        ("10.0.0.1 slots=1\n", {"10.0.0.1": (0,)}),
    ],
)
def test_parse_hostfile(text, expected):
    pool = parse_hostfile(text, "hf").pool()
    assert pool == expected
    assert list(pool) == list(expected)


@pytest.mark.parametrize(
    "text, message",
    [
        ("worker-1 slots=four\n", "hf:1: 'worker-1 slots=four': slots must be a positive integer, not 'four'"),
        ("w\n", "hf:1: 'w': missing slots=N (the number of devices on this host)"),
        ("w slots=0\n", "hf:1: 'w slots=0': slots must be a positive integer, not '0'"),
        ("w slots=-1\n", "hf:1: 'w slots=-1': slots must be a positive integer, not '-1'"),
        ("w slots=4x\n", "hf:1: 'w slots=4x': slots must be a positive integer, not '4x'"),
        ("w slots=\n", "hf:1: 'w slots=': slots must be a positive integer, not ''"),
        ("w max_slots=8 slots=1\n", "hf:1: 'w max_slots=8 slots=1': unknown key 'max_slots'; known: slots"),
        ("w slots=1 gpus=2\n", "hf:1: 'w slots=1 gpus=2': unknown key 'gpus'; known: slots"),
        ("w slots=1 slots=2\n", "hf:1: 'w slots=1 slots=2': slots= is given twice"),
        ("w slots=1 extra\n", "hf:1: 'w slots=1 extra': unexpected 'extra'; expected key=value such as slots=4"),
        ("a slots=1\n# x\na slots=2\n", "hf:3: 'a slots=2': host 'a' is already listed on line 1"),
        ("n[1-3] slots=1\nn2 slots=1\n", "hf:2: 'n2 slots=1': host 'n2' is already listed on line 1"),
        ("n[1,1] slots=1\n", "hf:1: 'n[1,1] slots=1': the range names the same host twice"),
        ("n[3-1] slots=1\n", "hf:1: 'n[3-1] slots=1': range '3-1' in 'n[3-1]' runs backwards"),
        ("n[1-x] slots=1\n", "hf:1: 'n[1-x] slots=1': bad range '1-x' in 'n[1-x]'; expected N or N-M with digits"),
        ("n[1-2 slots=1\n", "hf:1: 'n[1-2 slots=1': unbalanced brackets in 'n[1-2'"),
        ("slots=2\n", "hf:1: 'slots=2': line must start with a host name, e.g. 'worker-1 slots=4'"),
        ("a:1 slots=2\n", "hf:1: 'a:1 slots=2': bad host name 'a:1': '@', ':', ',' and '=' are not allowed"),
        ("a@b slots=2\n", "hf:1: 'a@b slots=2': bad host name 'a@b'"),
        ("", "hf: no hosts; add lines like 'worker-1 slots=4'"),
        ("# only comments\n\n", "hf: no hosts; add lines like 'worker-1 slots=4'"),
    ],
)
def test_parse_hostfile_errors(text, message):
    with pytest.raises(HostfileError) as caught:
        parse_hostfile(text, "hf")
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_error_carries_fields():
    with pytest.raises(HostfileError) as caught:
        parse_hostfile("a slots=1\nb slots=x\n", "my/hosts")
    err = caught.value
    assert (err.path, err.lineno, err.line) == ("my/hosts", 2, "b slots=x")
    assert err.exit_code == 2


def test_read_hostfile_missing(tmp_path):
    path = str(tmp_path / "nope")
    with pytest.raises(HostfileError, match="nope: no such file"):
        read_hostfile(path)


def test_read_hostfile_directory(tmp_path):
    with pytest.raises(HostfileError, match="is a directory"):
        read_hostfile(str(tmp_path))


def test_read_hostfile_not_utf8(tmp_path):
    path = tmp_path / "hf"
    path.write_bytes(b"w\xff slots=1\n")
    with pytest.raises(HostfileError, match=r":1: is not UTF-8 text \(byte 0xff\)"):
        read_hostfile(str(path))


def test_read_hostfile_unreadable(tmp_path):
    # Root reads mode-000 files, so provoke the OS error with a path through a regular file instead.
    blocker = tmp_path / "plain-file"
    blocker.write_text("")
    with pytest.raises(HostfileError, match="cannot read: NotADirectoryError"):
        read_hostfile(str(blocker / "hostfile"))


@pytest.mark.parametrize("name", sorted(os.listdir(os.path.join(ROOT, "hostfiles"))))
def test_example_hostfiles_parse(name):
    assert read_hostfile(os.path.join(ROOT, "hostfiles", name)).hosts


LINE = st.text(alphabet="ab01[]-,=# \tslotsx@:", max_size=25)


@settings(max_examples=300)
@given(st.lists(LINE, max_size=6))
def test_random_hostfiles_never_traceback(lines):
    try:
        hostfile = parse_hostfile("\n".join(lines), "hf")
    except HostfileError as err:
        assert str(err).startswith("hf")
        assert "\n" not in str(err)
        return
    pool = hostfile.pool()
    assert pool and all(slots == tuple(range(len(slots))) and slots for slots in pool.values())
