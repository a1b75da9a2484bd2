"""The start barrier's status line: the words every node's console shows while nodes join."""

import pytest

from xrun.common.output.status import PlainStatus, duration, waiting_line


@pytest.mark.parametrize("seconds, text", [
    (0, "0 s"), (40.9, "40 s"), (59, "59 s"), (60, "1 min 0 s"), (250, "4 min 10 s"), (3599, "59 min 59 s"),
    (3600, "1 h 0 min"), (3720, "1 h 2 min"), (-1, "0 s"),
])
def test_duration_reads_as_a_person_would(seconds, text):
    assert duration(seconds) == text


def test_waiting_line_names_the_missing_nodes_and_the_wait():
    assert waiting_line(5, 8, ["node3", "node7"], 250) == "5/8 nodes ready; waiting for node3, node7 (4 min 10 s)"
    many = waiting_line(1, 7, [f"node{i}" for i in range(2, 8)], 12)
    assert many == "1/7 nodes ready; waiting for node2, node3, node4, node5 and 2 more (12 s)"


def test_plain_status_prints_a_waiting_line_every_10_s_after_the_first_10(capsys):
    status = PlainStatus(3)
    for elapsed in (1, 5, 10.5, 15, 20.5):
        status.waiting(2, ["node3"], elapsed)
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["xrun: 2/3 nodes ready; waiting for node3 (10 s)", "xrun: 2/3 nodes ready; waiting for node3 (20 s)"]
