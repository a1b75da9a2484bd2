"""The plan digest: what a node is about to run, in a canonical form that every node of a pod-mode job compares.

In pod mode no node sends another a spec to execute: each runs its own command line. Each sends this digest
instead, so that a node started with another script, other arguments or another xrun is refused by name
(``first_difference``) rather than joining a job it does not match.

In the digest (the same on every node of a correctly started job):

* ``xrun``: the version (a mixed install is the first thing to rule out);
* ``script``, ``args`` (byte-exact), ``launch``: how the script is started (script / ``--module`` /
  ``--no_python``, ``--local_rank=N`` appended or not);
* ``world``: hosts and slots in node order. The selection flags are in through their effect: two nodes whose
  ``--num_gpus`` spellings differ but select the same slots run the same job;
* ``master``: the rendezvous address and port (a node with another one would wait for a master that never
  comes);
* ``exports``: the NAMES of the variables sent to the ranks (values may be secrets, and may differ per node
  on purpose, e.g. ``NCCL_SOCKET_IFNAME``);
* ``elastic``: the elastic settings, or null;
* ``restarts``: ``--max_restarts`` of a static job, only when above 0 (every node must wait for node 0's restart);
* ``replicas``: ``--replica_groups``, only with it: the group count, the groups' store ports and the Lighthouse's
  (a node with other groups would tell its ranks another contract and meet no one).

Out, because they differ between the nodes of a good job or belong to the node, not the job: this node's rank
and host name, the working directory, the interpreter path (venvs live in different places), environment
values, the agent's display and log options (``--log_dir``, ``--no_prefix``, ``--quiet``, binding), and the
run id (it is half of the channel key instead: ``xrun.runner.pod.secret.pod_key``).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from xrun import __version__
from xrun.channel.proof import sha256_hex  # CPython's own SHA-256: OpenSSL's _hashlib stays unloaded
from xrun.errors import XrunError

if TYPE_CHECKING:
    from xrun.runner.plan import Plan

_SHOWN = 60  # characters of an argument shown in a difference


class PlanDigestError(XrunError):
    """A digest from another node that is not what xrun sends (another program, or a damaged message)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"plan digest: {reason}")


@dataclass(frozen=True)
class PlanDigest:
    """``fields`` (plain JSON values) and the SHA-256 of their canonical JSON."""

    fields: Mapping[str, Any]
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"fields": dict(self.fields), "sha256": self.sha256}

    @classmethod
    def from_json(cls, data: Any) -> PlanDigest:
        if not isinstance(data, dict) or not isinstance(data.get("fields"), dict):
            raise PlanDigestError("expected {\"fields\": {...}, \"sha256\": \"...\"}")
        problem = _shape_problem(data["fields"])
        if problem:
            raise PlanDigestError(problem)
        digest = make_digest(data["fields"])
        if data.get("sha256") != digest.sha256:
            raise PlanDigestError("the sha256 does not match the fields")
        return digest


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _is_world(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(node, list) and len(node) == 2 and isinstance(node[0], str) and isinstance(node[1], list)
        and all(isinstance(slot, int) and not isinstance(slot, bool) for slot in node[1])
        for node in value
    )


# The fields this version words; another version may add fields (compared as plain values).
_SHAPES: dict[str, Callable[[Any], bool]] = {
    "xrun": lambda v: isinstance(v, str),
    "script": lambda v: isinstance(v, str),
    "args": _is_str_list,
    "launch": lambda v: isinstance(v, dict),
    "world": _is_world,
    "master": lambda v: isinstance(v, dict),
    "exports": _is_str_list,
    "elastic": lambda v: v is None or isinstance(v, dict),
}


def _shape_problem(fields: Mapping[str, Any]) -> str | None:
    for key, fits in _SHAPES.items():
        if key not in fields:
            return f"field {key!r} is missing"
        if not fits(fields[key]):
            return f"field {key!r} has the wrong type"
    return None


def canonical_json(fields: Mapping[str, Any]) -> str:
    """Sorted keys, no spaces, ASCII (arguments with undecodable bytes carry lone surrogates: escaped here)."""
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def make_digest(fields: Mapping[str, Any]) -> PlanDigest:
    try:
        text = canonical_json(fields)
    except (TypeError, ValueError) as err:
        raise PlanDigestError(f"fields are not plain JSON: {err}") from None
    return PlanDigest(fields=json.loads(text), sha256=sha256_hex(text.encode("ascii")))


def plan_digest(plan: Plan) -> PlanDigest:
    request = plan.request
    elastic = plan.nodes[0].elastic if plan.nodes else None  # resolved: counts and endpoint filled in
    replicas = plan.nodes[0].replicas if plan.nodes else None
    return make_digest({
        "xrun": __version__,
        "script": request.script,
        "args": list(request.args),
        "launch": {"mode": request.launch.mode.value, "local_rank_arg": request.launch.local_rank_arg},
        "world": [[host, list(slots)] for host, slots in plan.world.items()],
        "master": {"addr": plan.rendezvous.known_master_addr, "port": plan.rendezvous.master_port},
        "exports": sorted(request.env),
        "elastic": elastic.to_json() if elastic is not None else None,
        # --max_restarts: every node's xrun must wait for node 0's restart (absent without: digests stay as they were)
        **({"restarts": request.restart.max_restarts} if request.restart.restarts else {}),
        **({"replicas": replicas.to_json()} if replicas is not None else {}),  # absent without: digests as they were
    })


# ---------------------------------------------------------------------------------------------------------------
# The first difference, in words.


def first_difference(mine: PlanDigest, theirs: PlanDigest, *, node_name: str, my_name: str = "node 0") -> str | None:
    """One line naming the first field in which ``theirs`` (from ``node_name``) differs from ``mine``."""
    if mine.sha256 == theirs.sha256:
        return None
    keys = [*_WORDING, *sorted((set(mine.fields) | set(theirs.fields)) - set(_WORDING))]
    for key in keys:
        a, b = mine.fields.get(key), theirs.fields.get(key)
        if a != b:
            describe = _WORDING.get(key, _describe_other(key))
            return describe(node_name, b, my_name, a)
    return f"{node_name} plans another job than {my_name}"  # unreachable while the sha covers the fields


Describe = Callable[[str, Any, str, Any], str]


def _describe_other(key: str) -> Describe:
    return lambda them, b, me, a: f"{them} has {key} {_short(b)}; {me} has {_short(a)}"


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


def _version(them: str, b: Any, me: str, a: Any) -> str:
    return f"{them} has xrun {b}; {me} has {a}"


def _script(them: str, b: Any, me: str, a: Any) -> str:
    return f"{them} runs {_arg(b)}; {me} runs {_arg(a)}"


def _arg(value: Any) -> str:
    text = shlex.quote(str(value))
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


def _args(them: str, b: Any, me: str, a: Any) -> str:
    theirs, mine = list(b or ()), list(a or ())
    index = next((i for i, (x, y) in enumerate(zip(theirs, mine)) if x != y), min(len(theirs), len(mine)))
    return f"{them} passes {_excerpt(theirs, index)}; {me} passes {_excerpt(mine, index)}"


def _excerpt(args: Sequence[Any], index: int) -> str:
    """The differing argument with the option it belongs to: ``--lr 0.1``; past the end: what came last."""
    if index >= len(args):
        return "no more arguments" + (f" after {_arg(args[-1])}" if args else "")
    start = index - 1 if index > 0 and str(args[index - 1]).startswith("-") else index
    return " ".join(_arg(arg) for arg in args[start : index + 1])


_MODES = {"script": "as a script", "module": "as a module (--module)", "none": "directly (--no_python)"}


def _launch(them: str, b: Any, me: str, a: Any) -> str:
    b, a = b or {}, a or {}
    if b.get("mode") != a.get("mode"):
        return f"{them} runs the script {_MODES.get(b.get('mode'), b.get('mode'))}; {me} {_MODES.get(a.get('mode'))}"
    passes = {True: "appends --local_rank=N", False: "passes --no_local_rank"}
    return f"{them} {passes.get(b.get('local_rank_arg'), '?')}; {me} {passes.get(a.get('local_rank_arg'), '?')}"


def _world(them: str, b: Any, me: str, a: Any) -> str:
    theirs, mine = list(b or ()), list(a or ())
    if len(theirs) != len(mine):
        return f"{them} plans {len(theirs)} nodes; {me} plans {len(mine)}"
    for index, (x, y) in enumerate(zip(theirs, mine)):
        if x != y:
            return f"{them} has {_node(x)} as node {index}; {me} has {_node(y)}"
    return f"{them} plans another world; {me} plans {_short(a)}"


def _node(entry: Any) -> str:
    host, slots = entry  # the shape was checked (from_json) or made here (plan_digest)
    return f"{host} with slots {','.join(str(slot) for slot in slots)}"


def _master(them: str, b: Any, me: str, a: Any) -> str:
    def where(value: Any) -> str:
        return f"{value.get('addr')}:{value.get('port')}" if isinstance(value, dict) else _short(value)

    return f"{them} uses master {where(b)}; {me} uses {where(a)}"


def _exports(them: str, b: Any, me: str, a: Any) -> str:
    theirs, mine = set(b or ()), set(a or ())
    only_theirs, only_mine = sorted(theirs - mine), sorted(mine - theirs)
    if only_theirs:
        return f"{them} exports {only_theirs[0]}; {me} does not"
    if only_mine:
        return f"{me} exports {only_mine[0]}; {them} does not"
    return f"{them} exports {_short(b)}; {me} exports {_short(a)}"


def _elastic(them: str, b: Any, me: str, a: Any) -> str:
    if b is None or a is None:
        return f"{them} {'does not run' if b is None else 'runs'} --elastic; {me} {'does not' if a is None else 'does'}"
    key = next((k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)), "settings")
    return f"{them} has elastic {key}={_short(b.get(key))}; {me} has {key}={_short(a.get(key))}"


def _restarts(them: str, b: Any, me: str, a: Any) -> str:
    return f"{them} has --max_restarts {b or 0}; {me} has --max_restarts {a or 0}"


def _replicas(them: str, b: Any, me: str, a: Any) -> str:
    def groups(value: Any) -> str:  # their ports follow from the master port, compared before
        return f"--replica_groups {value.get('count')}" if isinstance(value, dict) else "no --replica_groups"

    return f"{them} has {groups(b)}; {me} has {groups(a)}"


_WORDING: dict[str, Describe] = {
    "xrun": _version,
    "script": _script,
    "launch": _launch,
    "args": _args,
    "world": _world,
    "master": _master,
    "exports": _exports,
    "elastic": _elastic,
    "restarts": _restarts,
    "replicas": _replicas,
}
