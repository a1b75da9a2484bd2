"""The ranks' Flight Recorder dumps in the form torch's own analyser reads (issue 40 §4).

``torchfrtrace DIR`` (``torch.distributed.flight_recorder.fr_trace``) reads a folder of one pickle per rank, named
a common prefix and the rank, each holding ``version``, ``pg_config`` and ``entries``: what a rank's
``_dump_fr_trace_json`` answers (xrun.launch.telemetry.reads), unpickled. So beside the file of a node's full
collective records (``xrun-collectives-<time>-<random>.json``) the node writes the folder of the same name, one
``rank_<N>`` per rank that answered, readable by its owner only like the file.

One repair on the way: torch 2.13 records the default group's config under an empty name while its entries name
that group ``"0"`` (``"process_group": ["0", "default_pg"]``), and the analyser then stops with
``KeyError: ('0', <rank>)``. The config is keyed as the entries name the group (``analyser_dump``); nothing else
of torch's dump changes. The ranks are the job's global ranks, so the folders of every node of a job can be put
into one and read together (docs/hang-doctor.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

RANK_PREFIX = "rank_"  # rank_0, rank_1, ...: the analyser strips the common prefix to find each file's rank


def analyser_dump(dump: Mapping[str, Any]) -> dict[str, Any]:
    """``dump`` with every group its entries name present in ``pg_config`` under that name: a group recorded
    under another key with the same description, or the default group's config recorded under ``""``, is keyed
    (and named) as the entries name it."""
    config = {str(key): value for key, value in (dump.get("pg_config") or {}).items() if isinstance(value, Mapping)}
    named = {(str(pg[0]), str(pg[1])) for entry in dump.get("entries") or () if isinstance(entry, Mapping)
             and isinstance(pg := entry.get("process_group"), (list, tuple)) and len(pg) == 2}
    used = {name for name, _ in named}
    for name, desc in sorted(named):
        if name in config:
            continue
        spare = [key for key, value in config.items() if key not in used
                 and (value.get("desc") == desc if desc != "default_pg" else key in ("", desc))]
        if spare:
            config[name] = {**config.pop(spare[0]), "name": name, "desc": desc}
    return {**dump, "pg_config": config}


def write_analyser_folder(records_file: str, full: Mapping[int, Mapping[str, Any]]) -> str | None:
    """The folder beside ``records_file`` (its name without ``.json``), mode 0700, with ``rank_<N>`` (0600) for
    every rank in ``full`` that has a dump; its path, or None when no rank has one. ``OSError`` is the caller's:
    the folder must be new (a name somebody made first, a link included, is never written into)."""
    dumps = {rank: dump for rank, answers in full.items()
             if isinstance(dump := answers.get("flight_recorder"), Mapping)}
    if not dumps:
        return None
    # lazy: pickle is ~1.7 ms of an agent's start (python -X importtime), needed only when a dump is written.
    # Written here for torch's analyser, which reads it with pickle; xrun never reads one.
    import pickle  # noqa: S403

    folder = records_file.removesuffix(".json")
    os.mkdir(folder, 0o700)
    for rank, dump in sorted(dumps.items()):
        fd = os.open(os.path.join(folder, f"{RANK_PREFIX}{rank}"),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as out:
            pickle.dump(analyser_dump(dump), out, protocol=pickle.HIGHEST_PROTOCOL)
    return folder
