"""Pod mode's hello policy (``xrun.runner.job.hello_policy.HelloPolicy``): node 0 accepts, refuses or ignores each node.

No spec is ever sent in pod mode: each node runs what its own command line says, so what node 0 checks is
that it says the same thing. A hello is

* a ``Stray`` (closed without a word) unless it carries a plan digest (its proof of this job's key, the shared
  secret or without one the run id, was checked before: ``xrun.runner.job.gate``, ``xrun.runner.pod.secret``);
* refused (``Refusal``: the job ends with exit code 2) when its plan digest differs from node 0's, naming
  the node and the first difference (``xrun.runner.pod.digest.first_difference``);
* otherwise accepted (``SendAccept``).

Pure: nothing is read or printed.
"""

from __future__ import annotations

from dataclasses import dataclass

from xrun.runner.job.events import Action, HelloReceived, SendAccept
from xrun.runner.job.hello_policy import Refusal, Stray
from xrun.runner.pod.digest import PlanDigest, first_difference


@dataclass(frozen=True)
class PodHello:
    digest: PlanDigest  # node 0's own plan digest
    run_id: str
    hosts: tuple[str, ...]  # by node rank, to name a refused node

    def answer(self, hello: HelloReceived) -> Action | Refusal | Stray:
        if hello.digest is None:
            return Stray()
        host = self.hosts[hello.node]
        difference = first_difference(self.digest, hello.digest, node_name=host)
        if difference is not None:
            return Refusal(f"node {hello.node} ({host}) runs another job: {difference}")
        return SendAccept(hello.node)
