"""The control server holds hundreds of agents on its one thread (issue 15): a few hundred simulated agents
(``bench.loadgen``, one selector) join, start, and are all stopped after one fails. Not timed: the bench's
``control_plane`` scenario measures 10,000."""

import threading

from bench.control_server import NoSessions, head_server
from bench.loadgen import LoadGen
from xrun.runner.job.nodes import NodeState

AGENTS = 300
TOKEN = "s" * 64


def test_hundreds_of_agents_on_one_thread():
    server = head_server(AGENTS, TOKEN, join_timeout=120)
    port = server.listen(["127.0.0.1"])
    codes = []
    before = threading.active_count()
    head = threading.Thread(target=lambda: codes.append(server.run(NoSessions(), own_signals=False)))
    head.start()
    gen = LoadGen("127.0.0.1", port, TOKEN, server.gate.fingerprint, nodes=AGENTS, connect_batch=64)
    try:
        gen.join(timeout=60)
        assert threading.active_count() == before + 1  # the server's own thread, none per agent
        assert all(server.job.state(node) is NodeState.RUNNING for node in range(AGENTS))
        gen.fail(node=0, code=7)
        gen.finish(timeout=60)
    finally:
        gen.close()
        head.join(timeout=30)
    assert codes == [7]
    assert gen.errors == []
    assert all(agent.stop_at is not None for agent in gen.agents[1:])  # every other node was told to stop
    assert server.failure is not None and server.failure.host == "sim0"
    assert server.conns == {} and server.pending == {}
    assert server.strays == 0  # every simulated agent proved its key: none was taken for a stranger
