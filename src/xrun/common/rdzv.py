"""Rendezvous settings for ``--elastic``: which ``--rdzv_conf`` keys each torch backend reads, and how
``--join_timeout`` becomes the timeouts that govern start-up. Pure: no torch here (the runner checks the keys
before anything starts; the agent applies the result to the torch it finds).

Why one knob: torch reads start-up limits from different keys per backend, and silently ignores keys it does
not know. ``--rdzv-conf timeout=1800`` with c10d does nothing (c10d reads only ``*_timeout`` names and the
store's ``read_timeout``), so a job whose nodes start minutes apart died at torch's defaults anyway
(seed 001). xrun sets every start-up timeout from ``--join_timeout`` and refuses keys the backend ignores.
"""

from __future__ import annotations

import importlib.util
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import replace

from xrun.common.rankplan import Rendezvous, World
from xrun.common.spec import RDZV_BACKENDS, ElasticOptions
from xrun.errors import UsageError
from xrun.hostlist import host_name_problem
from xrun.printable import shown
from xrun.strict_numbers import MAX_SECONDS, parse_int

# The keys each backend reads (torch 2.1 .. 2.13 ``rendezvous/*.py``); anything else is ignored by torch.
_DYNAMIC = (
    "join_timeout", "last_call_timeout", "close_timeout", "heartbeat_timeout", "read_timeout",
    "keep_alive_interval", "keep_alive_max_attempt",
)  # fmt: skip
KNOWN_KEYS: Mapping[str, tuple[str, ...]] = {
    "c10d": _DYNAMIC + ("is_host", "store_type"),
    "static": ("timeout",),
    "etcd": ("timeout", "last_call_timeout", "protocol", "cacert", "cert", "key", "etcd_prefix"),
    "etcd-v2": _DYNAMIC + ("protocol", "ssl_cert", "ssl_cert_key", "ca_cert"),
}
# Keys xrun sets itself from other flags: a user value would contradict them.
_OWN_KEYS: Mapping[str, str] = {"rank": "xrun sets it to the node rank"}
# Keys that read as integers of seconds (torch's get_as_int): checked here rather than failing on a node.
_INT_SUFFIXES = ("_timeout", "_interval", "_attempt")
# Keys with a closed set of values (torch's get_as_bool spellings; c10d's two store types).
_BOOLS = ("1", "true", "t", "yes", "y", "0", "false", "f", "no", "n")
CHOICES: Mapping[str, tuple[str, ...]] = {"is_host": _BOOLS, "store_type": ("tcp", "file")}
# Backends whose client library torch imports only when the rendezvous starts (a 40-line traceback on a node).
_NEEDS_MODULE: Mapping[str, str] = {"etcd": "etcd", "etcd-v2": "etcd"}

# torch's defaults for what xrun does not set, shown in the start-up line.
TORCH_DEFAULTS: Mapping[str, Mapping[str, str]] = {
    "c10d": {"last_call_timeout": "30", "close_timeout": "30", "heartbeat_timeout": "5"},
    "etcd-v2": {"last_call_timeout": "30", "close_timeout": "30", "heartbeat_timeout": "5"},
    "etcd": {"last_call_timeout": "30"},
    "static": {},
}


def parse_rdzv_conf(items: Iterable[str]) -> dict[str, str]:
    """``--rdzv_conf k=v,k2=v2`` (repeatable) -> ``{k: v}``; a bare key or an empty key is an error."""
    conf: dict[str, str] = {}
    for item in items:
        for part in item.split(","):
            part = part.strip()
            if not part:
                continue
            key, sep, value = part.partition("=")
            key = key.strip()
            if not sep or not key:
                raise UsageError("--rdzv_conf", f"{part!r} is not KEY=VALUE")
            conf[key] = value.strip()
    return conf


def check_rdzv_conf(backend: str, conf: Mapping[str, str]) -> None:
    """Refuse what torch would silently ignore (the 300 s barrier story), and malformed numbers."""
    if backend not in KNOWN_KEYS:
        raise UsageError("--rdzv_backend", f"unknown backend {backend!r}; known: {', '.join(RDZV_BACKENDS)}")
    known = KNOWN_KEYS[backend]
    for key, value in conf.items():
        if key in _OWN_KEYS:
            raise UsageError("--rdzv_conf", f"{key!r}: {_OWN_KEYS[key]}")
        if key not in known:
            hint = ""
            if key == "timeout" and "join_timeout" in known:
                hint = (f"; {backend} ignores 'timeout': use --join_timeout SECONDS "
                        "(xrun maps it onto every start-up timeout)")
            raise UsageError(
                "--rdzv_conf",
                f"{backend} does not read {key!r} (torch would silently ignore it){hint}; "
                f"known keys: {', '.join(known)}",
            )
        number = parse_int(value)
        if key.endswith(_INT_SUFFIXES) and not (number is not None and 0 < number <= MAX_SECONDS):
            raise UsageError("--rdzv_conf", f"{key}={shown(value)}: must be a positive whole number "
                             f"(at most {MAX_SECONDS:.0f})")
        if key in CHOICES and value.lower() not in CHOICES[key]:
            raise UsageError("--rdzv_conf", f"{key}={shown(value)}: must be one of {', '.join(CHOICES[key])}")


def parse_endpoint(text: str, *, port_zero: bool = False) -> tuple[str, int | None]:
    """``--rdzv_endpoint``: ``HOST[:PORT]`` or ``[IPV6][:PORT]``, strictly (torch's own parser raises deep inside
    the rendezvous on a node); the port is None when not given (torch's default). ``port_zero``: port 0 (a free
    one) is accepted, as a static job's endpoint takes it (torchtitan's ``localhost:0``)."""
    bracketed = re.fullmatch(r"\[([0-9A-Fa-f:.%A-Za-z]+)\](?::(.*))?", text)
    if bracketed:
        host, port_text = bracketed.group(1), bracketed.group(2)
    else:
        host, sep, port_text = text.partition(":")
        port_text = port_text if sep else None
        if ":" in (port_text or ""):
            raise UsageError("--rdzv_endpoint", f"{shown(text)}: write an IPv6 address in brackets, [::1]:29400")
        problem = host_name_problem(host)
        if problem:
            raise UsageError("--rdzv_endpoint", f"{shown(text)}: {problem}")
    if port_text is None:
        return host, None
    port = parse_int(port_text)
    low = 0 if port_zero else 1
    if port is None or not low <= port <= 65535 or port_text != port_text.strip():
        raise UsageError("--rdzv_endpoint", f"{shown(text)}: the port must be {low}..65535"
                         + (" (0: a free one)" if port_zero else ""))
    return host, port


def check_backend_available(backend: str) -> None:
    """The client library an etcd rendezvous needs, looked up (not imported) on this machine."""
    module = _NEEDS_MODULE.get(backend)
    if module is not None and importlib.util.find_spec(module) is None:
        raise UsageError("--rdzv_backend", f"{backend} needs the python-etcd package ({module!r} is not installed) "
                         "and an etcd server; use c10d (the default) or install it")


def check_elastic(options: ElasticOptions, hosts: int) -> None:
    """The combinations that cannot work, said before any node starts."""
    check_rdzv_conf(options.rdzv_backend, options.rdzv_conf)
    lo, hi = options.min_nodes, options.max_nodes
    if lo is not None and lo < 1:
        raise UsageError("--min_nodes", f"must be at least 1, not {lo}")
    if hi is not None and lo is not None and hi < lo:
        raise UsageError("--max_nodes", f"{hi} is less than --min_nodes {lo}")
    if hi is not None and hi < hosts:
        raise UsageError(
            "--max_nodes", f"{hi} is less than the {hosts} hosts selected; pick fewer hosts (--num_nodes, -i, -e)"
        )
    if options.max_restarts < 0:
        raise UsageError("--max_restarts", f"must be >= 0, not {options.max_restarts}")
    if options.join_timeout <= 0:
        raise UsageError("--join_timeout", f"must be > 0 seconds, not {options.join_timeout:g}")
    if not options.monitor_interval > 0:
        raise UsageError("--monitor_interval", f"must be > 0 seconds, not {options.monitor_interval:g}")
    if options.rdzv_backend == "static" and options.rdzv_endpoint and parse_endpoint(options.rdzv_endpoint)[1] is None:
        raise UsageError("--rdzv_endpoint", "static needs HOST:PORT (its store is the workers' master address too)")
    if options.rdzv_backend == "static" and (lo not in (None, hosts) or hi not in (None, hosts)):
        raise UsageError(
            "--rdzv_backend", f"static needs exactly the {hosts} selected nodes (no --min_nodes/--max_nodes)"
        )


def resolve(options: ElasticOptions, *, hosts: int, endpoint: str, run_id: str) -> ElasticOptions:
    """Fill what the request left open: node counts from the world, the endpoint, the rendezvous id."""
    hi = options.max_nodes if options.max_nodes is not None else max(hosts, options.min_nodes or 1)
    lo = options.min_nodes if options.min_nodes is not None else hi
    return replace(
        options,
        min_nodes=lo,
        max_nodes=hi,
        rdzv_endpoint=options.rdzv_endpoint or endpoint,
        rdzv_id=options.rdzv_id or run_id,
    )


def resolve_elastic(options: ElasticOptions | None, world: World, rendezvous: Rendezvous) -> ElasticOptions | None:
    """Pure: check the request against the world and fill the node counts, endpoint and rendezvous id."""
    if options is None:
        return None
    check_elastic(options, len(world))
    host = rendezvous.known_master_addr
    endpoint = f"[{host}]:{rendezvous.master_port}" if ":" in host else f"{host}:{rendezvous.master_port}"
    return resolve(options, hosts=len(world), endpoint=endpoint, run_id=rendezvous.run_id)


def seconds(value: float) -> str:
    """torch reads timeouts as whole seconds: round up, never to 0."""
    return str(max(1, math.ceil(value)))


def rendezvous_configs(options: ElasticOptions, node_rank: int) -> dict[str, str | int]:
    """The ``rdzv_configs`` torch gets: ``--join_timeout`` on every start-up timeout, then the user's keys.

    * c10d / etcd-v2: ``join_timeout`` (the whole rendezvous), ``read_timeout`` (every store operation,
      including the first connect to a store host that is still starting: torch's 60 s default kills a job
      whose store node comes up a minute late), and ``last_call_timeout`` when ``min_nodes == max_nodes``
      (then it only delays nothing; with fewer minimum nodes it is the wait for *extra* nodes and stays
      torch's 30 s so an elastic job starts with what it has and scales up later).
    * static / etcd: ``timeout`` (static: the store and every rank-assignment read).

    static's ``rank`` is an int, as torchrun passes it: torch's static handler hosts the store only where
    ``rank == 0``, so a string "0" left every node a client of a store nobody served (issue 25).
    """
    jt = seconds(options.join_timeout)
    backend = options.rdzv_backend
    conf: dict[str, str | int] = {}
    if backend in ("c10d", "etcd-v2"):
        conf = {"join_timeout": jt, "read_timeout": jt}
        if options.min_nodes == options.max_nodes:
            conf["last_call_timeout"] = jt
    elif backend == "etcd":
        conf = {"timeout": jt}
    elif backend == "static":
        conf = {"timeout": jt, "rank": node_rank}
    conf.update(options.rdzv_conf)
    return conf


def effective_timeouts(options: ElasticOptions, node_rank: int) -> dict[str, str]:
    """Every start-up timeout that will apply (xrun's, the user's, torch's defaults), for the start-up line."""
    shown: dict[str, str | int] = dict(TORCH_DEFAULTS.get(options.rdzv_backend, {}))
    shown.update(rendezvous_configs(options, node_rank))
    shown.pop("rank", None)
    return {k: str(v) for k, v in sorted(shown.items()) if k.endswith("timeout")}
