"""``xrun.discover()``: torch.distributed's env contract for a script started by mpirun/mpiexec/srun directly.

    mpirun -np 4 python train.py            # train.py calls xrun.discover(), then init_process_group("gloo")
    mpirun -np 4 python -m xrun.discovery train.py ARGS...   # the same, without touching train.py

Ranks come from the engine's own variables (no MPI call needed); ``MASTER_ADDR`` is rank 0's host, shared with
mpi4py (``allgather``), and ``MASTER_PORT`` a free port on rank 0 (``bcast``). Under srun without MPI the first
node of the step and a port derived from the job id are used, so mpi4py is not needed there. ``MASTER_ADDR`` /
``MASTER_PORT`` already in the environment win.

The pip wheel of mpi4py 4 carries both MPI ABIs and picks one when ``mpi4py.MPI`` is imported. Left alone it
loads ``libmpi.so`` (OpenMPI on Debian) even under MPICH, and then every rank sees a world of one. ``discover``
therefore sets ``MPI4PY_MPIABI`` from the engine that started the process (unless set) and checks the MPI
world size against the engine's; MPICH on Debian also needs ``libmpi.so.12``, which only exists as
``libmpich.so.12`` there: the error says how to provide it (``python -m xrun.discovery --mpich-shim DIR``).
"""

from __future__ import annotations

import os
import runpy
import socket
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable

from xrun.errors import XrunError
from xrun.hostlist import HostlistSyntaxError, expand_hostlist
from xrun.net import free_port

LOOPBACK = "127.0.0.1"
SLURM_PORT_BASE = 20000  # srun without MPI: MASTER_PORT = base + job id % span (same on every task)
SLURM_PORT_SPAN = 20000
MPICH_LIBRARY = "libmpich.so.12"
MPICH_ABI_NAME = "libmpi.so.12"  # what mpi4py's MPICH build links against


class DiscoverError(XrunError):
    """Not under an engine xrun knows, or the MPI library cannot do what is needed; says what to do."""


@dataclass(frozen=True)
class EngineRanks:
    """What the engine's environment says about this process."""

    engine: str  # openmpi | hydra | mvapich | pmix | slurm
    rank: int
    size: int | None  # None: the engine does not export it (PMIx): ask MPI
    local_rank: int | None
    local_size: int | None
    mpi_abi: str | None  # for MPI4PY_MPIABI; None: not an MPI engine (srun alone)


@dataclass(frozen=True)
class Discovered:
    """The torch.distributed contract derived for this process (also written to ``os.environ``)."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str
    master_port: int
    engine: str

    def env(self) -> dict[str, str]:
        return {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }


# ---------------------------------------------------------------------------------------------------------------
# Pure: the engine's variables.

# engine -> (rank, size, local rank, local size, MPI ABI); the first engine whose rank variable is set wins.
# OpenMPI and hydra come before Slurm: under an allocation their ranks also inherit SLURM_* of the launch step.
ENGINE_VARIABLES: tuple[tuple[str, tuple[str, str | None, str | None, str | None], str | None], ...] = (
    ("openmpi", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                 "OMPI_COMM_WORLD_LOCAL_SIZE"), "openmpi"),
    ("mvapich", ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK",
                 "MV2_COMM_WORLD_LOCAL_SIZE"), "mpich"),
    ("hydra", ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"), "mpich"),
    ("pmix", ("PMIX_RANK", None, None, None), None),
    ("slurm", ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None), None),
)
KNOWN_RANK_VARIABLES = tuple(names[0] for _, names, _ in ENGINE_VARIABLES)


def _int(env: Mapping[str, str], name: str | None) -> int | None:
    if name is None or not env.get(name, "").strip():
        return None
    value = env[name].strip()
    if not value.isdigit():
        raise DiscoverError(f"{name}={value!r} is not a non-negative integer")
    return int(value)


def engine_ranks(env: Mapping[str, str]) -> EngineRanks:
    """Read this process's place from the engine's variables; not started by an engine is an error."""
    for engine, (rank_name, size_name, local_name, local_size_name), abi in ENGINE_VARIABLES:
        rank = _int(env, rank_name)
        if rank is None:
            continue
        if engine == "slurm" and not env.get("SLURM_STEP_ID", "").strip():
            continue  # a batch script or salloc shell carries SLURM_PROCID=0 but is not a task of a step
        size = _int(env, size_name)
        local_size = _int(env, local_size_name)
        if engine == "slurm":
            size = _int(env, "SLURM_STEP_NUM_TASKS") or size
            local_size = _slurm_local_size(env)
        if engine == "pmix":
            abi = "openmpi" if env.get("OMPI_VERSION") or env.get("PMIX_NAMESPACE", "").startswith("prterun") else None
        return EngineRanks(engine, rank, size, _int(env, local_name), local_size, abi)
    raise DiscoverError(
        "not started by mpirun, mpiexec or srun: none of " + ", ".join(KNOWN_RANK_VARIABLES) + " is set; run "
        "`mpirun -np N python SCRIPT` (or `srun`), or start the script with `xrun SCRIPT`, which sets RANK etc. itself"
    )


def _slurm_local_size(env: Mapping[str, str]) -> int | None:
    """This node's task count: SLURM_STEP_TASKS_PER_NODE (``2(x3),1``) at index SLURM_NODEID."""
    text, node = env.get("SLURM_STEP_TASKS_PER_NODE", "").strip(), _int(env, "SLURM_NODEID")
    if not text or node is None:
        return None
    counts: list[int] = []
    for item in text.split(","):
        count, _, repeat = item.partition("(x")
        if not count.strip().isdigit():
            return None
        counts += [int(count)] * (int(repeat.rstrip(")")) if repeat.rstrip(")").isdigit() else 1)
    return counts[node] if node < len(counts) else None


def slurm_master(env: Mapping[str, str]) -> tuple[str, int]:
    """srun alone: the step's first node (task 0 sits there under block and cyclic distribution) and a port
    every task derives from the job id."""
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    try:
        first = expand_hostlist(nodelist)[0] if nodelist.strip() else ""
    except HostlistSyntaxError as err:
        raise DiscoverError(f"SLURM_STEP_NODELIST={nodelist!r}: {err}") from None
    if not first:
        raise DiscoverError("srun did not set SLURM_STEP_NODELIST; set MASTER_ADDR yourself")
    job = _int(env, "SLURM_JOB_ID") or 0
    return first, SLURM_PORT_BASE + job % SLURM_PORT_SPAN


def local_rank_among(hosts: Sequence[str], rank: int) -> tuple[int, int]:
    """(local rank, local size) of ``rank`` given every rank's host (from an allgather)."""
    mine = hosts[rank]
    same = [r for r, host in enumerate(hosts) if host == mine]
    return same.index(rank), len(same)


def choose_master_addr(
    hosts: Sequence[str], resolve: Callable[[str], str | None], route: Callable[[str], str | None]
) -> str:
    """Rank 0's address as the others can use it: loopback when everything is on one host; rank 0's host name
    when it resolves to a real address; else the source address of rank 0's route to another rank's host."""
    own = hosts[0]
    others = [host for host in hosts if host != own]
    if not others:
        return LOOPBACK
    resolved = resolve(own)
    if resolved is not None and not resolved.startswith("127.") and resolved != "::1":
        return own
    for host in others:
        peer = resolve(host)
        source = route(peer) if peer is not None else None
        if source is not None:
            return source
    return own


# ---------------------------------------------------------------------------------------------------------------
# I/O: mpi4py, sockets, the environment.


def _resolve(host: str) -> str | None:
    try:
        return str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
    except (socket.gaierror, IndexError):
        return None


def _route_source(addr: str) -> str | None:
    try:
        with socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((addr, 9))  # a UDP connect sends nothing; it only picks the route
            return str(probe.getsockname()[0])
    except OSError:
        return None


def mpich_shim_hint() -> str:
    return (
        f"Debian/Ubuntu's MPICH ships {MPICH_LIBRARY} but mpi4py's MPICH build needs {MPICH_ABI_NAME}: run "
        "`python -m xrun.discovery --mpich-shim DIR` once, then start the ranks with "
        "`mpiexec -genv LD_LIBRARY_PATH DIR ...` (or export LD_LIBRARY_PATH=DIR before mpiexec)"
    )


def import_mpi(abi: str | None, environ: MutableMapping[str, str]) -> Any:
    """``mpi4py.MPI`` for the engine's ABI; every failure becomes one DiscoverError that says what to do."""
    if abi is not None and not environ.get("MPI4PY_MPIABI"):
        environ["MPI4PY_MPIABI"] = abi  # read by mpi4py when mpi4py.MPI is imported
    try:
        import mpi4py  # noqa: F401 - optional: only where it is installed and asked for; its absence is one line
    except ImportError:
        raise DiscoverError(
            "mpi4py is not installed; `pip install mpi4py` (or 'xrun[mpi]') in the environment the ranks use"
        ) from None
    try:
        from mpi4py import MPI  # optional: only where it is installed and asked for
    except (ImportError, OSError, RuntimeError) as err:
        text = str(err)
        hint = mpich_shim_hint() if MPICH_ABI_NAME in text else (
            f"check MPI4PY_MPIABI={environ.get('MPI4PY_MPIABI')!r} matches the MPI that started this process"
        )
        first = text.splitlines()[0] if text else repr(err)
        raise DiscoverError(f"mpi4py cannot load the MPI library ({first}); {hint}") from None
    return MPI


def discover(*, environ: MutableMapping[str, str] | None = None, set_env: bool = True) -> Discovered:
    """Derive RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and (by default) export
    them into ``os.environ``, so ``torch.distributed.init_process_group("gloo")`` (env://) just works.

    Every rank must call it (it is collective under MPI). Raises DiscoverError with the next step when the
    process was not started by an engine, or when mpi4py is missing or loaded the wrong MPI.
    """
    env = os.environ if environ is None else environ
    ranks = engine_ranks(env)
    if ranks.engine == "slurm":
        found = _discover_slurm(ranks, env)
    else:
        found = _discover_mpi(ranks, env)
    if set_env:
        env.update(found.env())
    return found


def _discover_slurm(ranks: EngineRanks, env: Mapping[str, str]) -> Discovered:
    addr, port = slurm_master(env)
    size = ranks.size if ranks.size is not None else 1
    return Discovered(
        rank=ranks.rank,
        local_rank=ranks.local_rank if ranks.local_rank is not None else 0,
        world_size=size,
        local_world_size=ranks.local_size if ranks.local_size is not None else 1,
        master_addr=env.get("MASTER_ADDR") or addr,
        master_port=_int(env, "MASTER_PORT") or port,
        engine="slurm",
    )


def _discover_mpi(ranks: EngineRanks, env: MutableMapping[str, str]) -> Discovered:
    mpi = import_mpi(ranks.mpi_abi, env)
    comm = mpi.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    if (ranks.size is not None and size != ranks.size) or rank != ranks.rank:
        chosen = env.get("MPI4PY_MPIABI")
        library = mpi.Get_library_version().split(",")[0].strip()
        if ranks.mpi_abi is not None and chosen != ranks.mpi_abi:
            hint = f"set MPI4PY_MPIABI={ranks.mpi_abi} (the job was started by {ranks.engine})"
        else:
            hint = mpich_shim_hint() if ranks.mpi_abi == "mpich" else "set MPI4PY_MPIABI to match mpirun's MPI"
        raise DiscoverError(
            f"the engine started rank {ranks.rank} of {ranks.size} but mpi4py's MPI sees rank {rank} of {size}: "
            f"mpi4py loaded another MPI than the one that started the job (MPI4PY_MPIABI={chosen!r}, {library}); "
            + hint
        )
    hosts = comm.allgather(mpi.Get_processor_name())
    master: tuple[str, int] | None = None
    if rank == 0:
        addr = env.get("MASTER_ADDR") or choose_master_addr(hosts, _resolve, _route_source)
        master = (addr, _int(env, "MASTER_PORT") or free_port(addr, every_address=True))
    addr, port = comm.bcast(master, root=0)
    local_rank, local_size = local_rank_among(hosts, rank)
    return Discovered(
        rank=rank,
        local_rank=ranks.local_rank if ranks.local_rank is not None else local_rank,
        world_size=size,
        local_world_size=ranks.local_size if ranks.local_size is not None else local_size,
        master_addr=addr,
        master_port=port,
        engine=ranks.engine,
    )


# ---------------------------------------------------------------------------------------------------------------
# python -m xrun.discovery [--mpich-shim DIR | SCRIPT ARGS...]


LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")


def make_mpich_shim(directory: str, search: Sequence[str] = LIBRARY_DIRS) -> str:
    """A directory with ``libmpi.so.12 -> libmpich.so.12`` for mpi4py's MPICH ABI; returns the link's path."""
    candidates = (os.path.join(d, MPICH_LIBRARY) for d in search)
    found = next((path for path in candidates if os.path.exists(path)), None)
    if found is None:
        raise DiscoverError(f"{MPICH_LIBRARY} not found in {', '.join(search)}; is MPICH installed?")
    link = os.path.join(directory, MPICH_ABI_NAME)
    try:
        os.makedirs(directory, exist_ok=True)
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink(found, link)
    except OSError as err:  # /proc/x, a file in the way, a read-only filesystem: the reason, not a traceback
        raise DiscoverError(f"--mpich-shim {directory!r}: cannot make {link}: {err.strerror or err}; "
                            "name a directory you can write") from None
    return link


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: python -m xrun.discovery SCRIPT [ARGS...] | --mpich-shim DIR"
    try:
        if args[:1] == ["--mpich-shim"] and len(args) == 2:
            link = make_mpich_shim(args[1])
            print(f"{link} -> {os.readlink(link)}; now use LD_LIBRARY_PATH={args[1]} MPI4PY_MPIABI=mpich")
            return 0
        if args[:1] == ["--"]:
            args = args[1:]
        if not args or args[0].startswith("-"):
            print(usage, file=sys.stderr)
            return 2
        discover()
        if not os.path.isfile(args[0]) and not os.path.isfile(os.path.join(args[0], "__main__.py")):
            raise DiscoverError(f"SCRIPT {args[0]!r}: no such file in {os.getcwd()}")  # not run_path's traceback
    except DiscoverError as err:
        print(f"xrun.discovery: {err}", file=sys.stderr)
        return err.exit_code
    sys.argv = args
    runpy.run_path(args[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
