"""A replica group across nodes (issue 39 §2, docs/replica-groups.md): the head's rules as event tables (pure, as
tests/test_job.py), and the wire from the nodes (the agent machine's part: tests/test_agent_machine.py). The node's policy for a
shared group is tests/test_replica_groups.py's; the real job on several nodes tests/cluster/test_replica_groups_nodes.py.
"""

from dataclasses import replace

import pytest

from tests.test_job import JOINED, STATIC, hello, play
from xrun.channel import ChannelError, Kind, message
from xrun.common.result.group_restart import GroupRestart
from xrun.runner.job.events import (
    ConnectionLost,
    Done,
    GroupFailed,
    GroupRestarted,
    GroupRestartedAcross,
    GroupStopped,
    Ready,
    SendGroupOrder,
    SendSpec,
    SendStart,
    SendStop,
    ShowLine,
)
from xrun.runner.job.wire import agent_event
from xrun.runner.replicas.moves import GroupLayout
from xrun.runner.replicas.restarts import GroupRestarts
from xrun.runner.restart_options import RestartPolicy

# --replica_groups 2 --max_restarts 2 over a (2 slots), b, c (1 slot each): group 0 lies on a alone (its node's),
# group 1 spans b and c (the head's)
SPANS = replace(STATIC, world_size=4, groups=GroupLayout(2, (((0, 0),), ((1, 2),), ((1, 3),))))
RUNNING = [*JOINED, Ready(0, 29501), Ready(1), Ready(2)]


def failed(node, rank, *, restart=1, at=100.0):
    return GroupFailed(node, GroupRestart(group=1, restart=restart, budget=2, rank=rank, cause="was killed by SIGKILL",
                                          at=at, others=()))


def orders(actions):
    return [a for a in actions if isinstance(a, SendGroupOrder)]


def test_a_failure_in_a_group_across_nodes_stops_it_on_its_other_nodes_then_starts_it_on_all():
    job, actions = play([*RUNNING, 5.0, failed(2, 3)], config=SPANS)
    restart = GroupRestart(group=1, restart=1, budget=2, rank=3, cause="was killed by SIGKILL", at=100.0, others=())
    assert GroupRestartedAcross("c", ("b", "c"), restart) in actions  # the record's one entry, from the head
    assert ShowLine("replica group 1: rank 3 was killed by SIGKILL on c; restarting group 1 on b, c (restart 1 of 2), "
                    "every other group keeps running") in actions
    assert orders(actions) == [SendGroupOrder((1,), 1)]  # b alone is told to stop: a holds no rank of group 1
    assert not [a for a in actions if isinstance(a, SendStop)] and not job.stopping
    job, actions = play([GroupStopped(2, 1)], job)
    assert orders(actions) == []  # b's ranks of it are not gone yet
    job, actions = play([failed(1, 2), GroupStopped(1, 1)], job)  # b's rank failed too meanwhile: the same restart
    assert orders(actions) == [SendGroupOrder((1, 2), 1, 1)] and job.groups.book.restarts[1] == 1
    job, actions = play([6.0, failed(1, 2, restart=2)], job)  # the next failure: the next restart
    assert orders(actions) == [SendGroupOrder((2,), 1)] and job.groups.book.restarts[1] == 2
    job, actions = play([GroupStopped(1, 1), GroupStopped(2, 1), GroupRestarted(0, group=0, restart=1)], job)
    assert orders(actions) == [SendGroupOrder((1, 2), 1, 2)]  # group 0's restart is a's own: no order
    job, _ = play([9.0, Done(0), Done(1), Done(2)], job)
    assert job.verdict().exit_code == 0


def test_a_node_over_meanwhile_is_not_waited_for_nor_told_to_start():
    job, _ = play([*RUNNING, 5.0, failed(2, 3)], config=SPANS)
    job, actions = play([GroupStopped(2, 1)], job)
    assert orders(actions) == []
    job, actions = play([Done(1)], job)  # b's rank of group 1 had finished: b is done
    assert orders(actions) == [SendGroupOrder((2,), 1, 1)]


def test_a_node_lost_while_its_group_restarts_ends_the_job_and_nothing_starts_again():
    job, _ = play([*RUNNING, 5.0, failed(2, 3)], config=SPANS)
    job, actions = play([ConnectionLost(1, "connection reset")], job)
    assert [a.nodes for a in actions if isinstance(a, SendStop)] == [(0, 2)] and job.stopping
    assert job.failure.reason.startswith("lost node b: its agent's connection dropped (connection reset)")
    job, actions = play([GroupStopped(2, 1), failed(2, 3)], job)
    assert orders(actions) == []  # the job's stop reaches every rank


def test_the_wire_both_ways():
    restart = GroupRestart(group=1, restart=1, budget=2, rank=3, cause="exited with code 1", at=1.5, others=())
    assert agent_event(2, message(Kind.GROUP_FAILED, **restart.to_json())) == GroupFailed(2, restart)
    assert agent_event(2, message(Kind.GROUP_STOPPED, group=1)) == GroupStopped(2, 1)
    with pytest.raises(ChannelError, match="group_failed: a malformed group restart"):
        agent_event(2, message(Kind.GROUP_FAILED, **{**restart.to_json(), "at": "soon"}))


def test_the_record_names_every_node_of_a_group_across_nodes():
    restarts = GroupRestarts()
    restart = GroupRestart(group=1, restart=1, budget=2, rank=3, cause="was killed by SIGKILL", at=1.5, others=())
    line = restarts.add("c", restart, hosts=("b", "c"))
    assert line == {"host": "c", "hosts": ["b", "c"], "group": 1, "restart": 1, "budget": 2, "rank": 3,
                    "cause": "was killed by SIGKILL", "at": 1.5, "others": []}
    assert restarts.to_json() == [line]



# --spares 1 as well: d (agent 3) stands by
SPANS_SPARE = replace(SPANS, spares=("d",), restart=RestartPolicy(spares=1))
SPARE_RUNNING = [*JOINED, hello(3), Ready(3), Ready(0, 29501), Ready(1), Ready(2)]


@pytest.mark.parametrize(("lost", "other", "meet_at"), [(1, 2, "d"), (2, 1, None)])
def test_a_lost_node_of_a_group_across_nodes_hands_its_ranks_to_the_spare_after_the_others_stopped(lost, other,
                                                                                                 meet_at):
    """b led group 1 (its rank 0's node, its store): lost, c's ranks of it meet at the spare d from then on; c lost,
    b keeps leading. Either way the other node stops its ranks of it first, and a (group 0) hears nothing."""
    job, actions = play([*SPARE_RUNNING, 5.0, ConnectionLost(lost, "connection reset")], config=SPANS_SPARE)
    assert not job.stopping and not [a for a in actions if isinstance(a, SendStop)]
    assert SendSpec(3, False, node_rank=lost, group_restarts=((1, 1),)) in actions
    assert orders(actions) == [SendGroupOrder((other,), 1)]  # the other node of group 1 stops its ranks of it
    job, actions = play([Ready(3)], job)  # the spare is ready: it waits for the other node's stop
    assert not [a for a in actions if isinstance(a, SendStart)]
    job, actions = play([GroupStopped(other, 1)], job)  # gone: both start, the spare by its start, the other by order
    assert orders(actions) == [SendGroupOrder((other,), 1, 1, meet_at)]
    assert [a for a in actions if isinstance(a, SendStart)] == [SendStart((3,), "10.0.0.1", 29501)]
    job, _ = play([9.0, Done(0), Done(other), Done(3)], job)
    assert job.verdict().exit_code == 0 and job.groups.book.restarts == {0: 0, 1: 1}


def test_a_spare_ready_after_the_others_stopped_starts_at_once():
    job, _ = play([*SPARE_RUNNING, 5.0, ConnectionLost(2, "connection reset"), GroupStopped(1, 1)],
                  config=SPANS_SPARE)
    job, actions = play([Ready(3)], job)
    assert [a for a in actions if isinstance(a, SendStart)] == [SendStart((3,), "10.0.0.1", 29501)]


def test_a_node_lost_while_its_group_across_nodes_restarts_cannot_move_and_ends_the_job():
    job, actions = play([*SPARE_RUNNING, 5.0, failed(2, 3), ConnectionLost(1, "connection reset")], config=SPANS_SPARE)
    assert job.stopping and job.failure.reason.endswith(
        "its replica groups cannot start again elsewhere: a group of it across nodes is restarting already")
