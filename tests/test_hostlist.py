import pytest
from hypothesis import given
from hypothesis import strategies as st

from xrun.hostlist import HostlistSyntaxError, expand_host_pattern, expand_hostlist


@pytest.mark.parametrize(
    "text, expected",
    [
        ("node1", ["node1"]),
        ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
        ("node[8-10]", ["node8", "node9", "node10"]),
        ("node[08-10]", ["node08", "node09", "node10"]),
        ("node[01-02],gpu-a[1-2]", ["node01", "node02", "gpu-a1", "gpu-a2"]),
        ("a,b,c", ["a", "b", "c"]),
        ("r[1-2]-n[1-2]", ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]),
        ("n[3]", ["n3"]),
        ("x[1-1]y", ["x1y"]),
    ],
)
def test_expand_hostlist(text, expected):
    assert expand_hostlist(text) == expected


@pytest.mark.parametrize(
    "text, message",
    [
        ("node[3-1]", "runs backwards"),
        ("node[a-b]", "bad range 'a-b'"),
        ("node[", "unclosed '['"),
        ("node]", "unbalanced ']'"),
        ("node[]", "empty range"),
        ("a,,b", "empty host name"),
        ("node[1-2", "unclosed '['"),
        ("node[1,]", "bad range ''"),
        ("node[-1]", "bad range '-1'"),
    ],
)
def test_expand_hostlist_errors(text, message):
    with pytest.raises(HostlistSyntaxError, match=message.replace("[", r"\[")):
        expand_hostlist(text)


@given(st.text(alphabet="ab0123[]-,", max_size=20))
def test_expand_host_pattern_never_crashes(text):
    try:
        names = expand_host_pattern(text)
    except HostlistSyntaxError:
        return
    assert all(isinstance(name, str) for name in names)


def test_size_is_counted_before_expanding():
    from xrun.hostlist import pattern_size

    assert pattern_size("n[01-03,07]x[1-2]") == 8
    assert expand_hostlist("n[1-3],m", limit=4) == ["n1", "n2", "n3", "m"]
    with pytest.raises(HostlistSyntaxError, match="names 100000000 hosts; at most 65536"):
        expand_hostlist("n[0-99999999]", limit=65536)  # refused at once, nothing expanded
    with pytest.raises(HostlistSyntaxError, match="bad range"):
        expand_hostlist("n[a-b]", limit=10)
