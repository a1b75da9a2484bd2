"""The package's layering, read from the source (ast): who imports whom, at module level, inside functions, or
only for type checking.

* three layers (issue 38 §2): ``xrun.runner`` (the head), ``xrun.launch`` (every node) and, below both, the shared
  ``xrun.common`` (what both need: the spec, the rank plan and env contract, records, the result views,
  rendering). ``launch`` never imports ``runner`` and ``runner`` never imports ``launch``, at any level;
  ``common`` imports neither. What joins the head and a node in one process sits above both (``xrun.joined``),
  and only a process's entry imports it;
* an entry (a ``__main__``: ``python -m xrun``, ``python -m xrun.launch``) is a root, no module of the layer whose
  folder holds it (``-m`` puts it there): nothing imports it, so what it imports puts no layer above another;
* only the elastic adapter (``xrun/launch/elastic/``) imports torch;
* the imports inside ``xrun`` have no cycle, counting those inside functions and the type-checking ones: a
  function-level import that points back up is a circle all the same, only hidden (issue 30 §6);
* folders depend one way, function-level imports counted;
* reading every backend's traits loads nothing heavy (paramiko, psutil, rich, torch, the control server).
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import MappingProxyType

from tests.conftest import ROOT

PACKAGE = Path(ROOT) / "src" / "xrun"


class Level(Enum):
    MODULE = "module"  # runs when the module is imported
    FUNCTION = "function"  # runs when the function is called
    TYPE_CHECKING = "type_checking"  # never runs


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    level: Level


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache  # walked once a run: a test asks for every import edge (test_folders_depend_one_way: ~16 s)
def all_modules() -> Mapping[str, Path]:
    return MappingProxyType({module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))})


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, level: Level):
    """(imported names, level) for every import statement under ``tree``, with the level it runs at."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, level
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _imports(child, Level.FUNCTION if level is Level.MODULE else level)
        elif isinstance(child, ast.If) and _is_type_checking(child):
            for stmt in child.body:
                yield from _imports(ast.Module(body=[stmt], type_ignores=[]), Level.TYPE_CHECKING)
            for stmt in child.orelse:
                yield from _imports(ast.Module(body=[stmt], type_ignores=[]), level)
        else:
            yield from _imports(child, level)


def _targets(node: ast.Import | ast.ImportFrom, source: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: resolve against the importing module's package
        package = source.split(".") if is_package else source.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    # "from a import b" imports a, and a.b too when b is a module
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


@functools.cache  # the source does not change during a run: parsed once, not once per test (~1 s each)
def import_edges() -> tuple[Edge, ...]:
    modules = all_modules()
    edges = []
    for source, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node, level in _imports(tree, Level.MODULE):
            for target in _targets(node, source, path.name == "__init__.py"):
                edges.append(Edge(source, target, level))
    return tuple(edges)


def internal_graph(edges: tuple[Edge, ...], levels: set[Level]) -> dict[str, set[str]]:
    """Module -> the xrun modules it loads, parents included (importing a.b.c runs a/__init__ and a/b/__init__)."""
    modules = all_modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for edge in edges:
        if edge.level not in levels or edge.target not in modules:
            continue
        parts = edge.target.split(".")
        for i in range(1, len(parts) + 1):
            target = ".".join(parts[:i])
            if target in modules and target != edge.source and not edge.source.startswith(target + "."):
                graph[edge.source].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def is_entry(module: str) -> bool:
    """A process's entry (``python -m PACKAGE`` runs PACKAGE/__main__.py as ``__main__``): a root, in no layer."""
    return module == "__main__" or module.endswith(".__main__")


def layer_edges() -> list[Edge]:
    """Every import of a layer's module: an entry's are the root's, not its folder's layer's."""
    return [e for e in import_edges() if not is_entry(e.source)]


def test_nothing_imports_an_entry():
    assert [e for e in import_edges() if is_entry(e.target)] == []


def test_launch_never_imports_runner():
    bad = [e for e in layer_edges() if e.source.startswith("xrun.launch") and e.target.startswith("xrun.runner")]
    assert bad == []


def test_the_shared_layer_imports_neither_layer():
    bad = [e for e in layer_edges() if e.source.startswith("xrun.common") and e.target.startswith(("xrun.launch", "xrun.runner"))]  # noqa: E501
    assert bad == []


def test_runner_never_imports_launch():
    bad = [e for e in layer_edges() if e.source.startswith("xrun.runner") and e.target.startswith("xrun.launch")]
    assert bad == []


# The runs that join the head and a node in one process (the local run's and the stand-alone agent's one-node job,
# a pod node): above both layers; xrun's entry hands them to the head's command line as a typed ``InProcess``, the
# agent's entry (python -m xrun.launch) runs the stand-alone agent's
JOINED = "xrun.joined"


def test_only_the_entries_import_what_joins_the_layers():
    importers = {e.source for e in import_edges() if e.target == JOINED or e.target.startswith(JOINED + ".")}
    outside = {name for name in importers if name != JOINED and not name.startswith(JOINED + ".")}
    assert outside == {"xrun.__main__", "xrun.launch.__main__"} and all(is_entry(name) for name in outside)


# --network=allreduce's worker: a process of its own (python -m), started only for that mode, imported by nobody
ALLREDUCE_WORKER = "xrun.launch.network.allreduce_worker"


def test_only_the_elastic_adapter_imports_torch():
    importers = {e.source for e in import_edges() if e.target == "torch" or e.target.startswith("torch.")}
    assert importers <= {name for name in all_modules() if name.startswith("xrun.launch.elastic")} | {ALLREDUCE_WORKER}
    assert [e.source for e in import_edges() if e.target == ALLREDUCE_WORKER] == []


def test_no_cycle_among_module_level_imports():
    assert cycles(internal_graph(import_edges(), {Level.MODULE})) == []


def test_no_cycle_even_counting_type_checking_imports():
    # A type-only cycle runs nothing, but it is still two modules that each need the other to be read.
    assert cycles(internal_graph(import_edges(), {Level.MODULE, Level.TYPE_CHECKING})) == []


def test_no_cycle_of_any_kind_function_level_imports_counted():
    # An import inside a function that points back up runs after both modules are loaded, so Python accepts it;
    # it is still two modules that each need the other (issue 30 §6: connect <-> restarts, allreduce <-> probe).
    assert cycles(internal_graph(import_edges(), set(Level))) == []


def loaded_by(code: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` a fresh interpreter has loaded after running ``code``."""
    check = f"import sys\n{code}\nprint(sorted(m for m in {modules!r} if m in sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    return ast.literal_eval(out.strip())


def test_reading_every_backends_traits_loads_nothing_heavy():
    code = ("from xrun.runner.backends import backend_traits, known_backends\n"
            "traits = {name: backend_traits(name) for name in known_backends()}")
    assert loaded_by(code, ("paramiko", "psutil", "rich", "torch", "xrun.runner.job.control_server")) == []


def test_the_connected_agents_start_loads_no_reader_of_the_ranks_and_nothing_a_plain_node_leaves_unused():
    # issue 38: nothing reads a rank before its first sample, Ctrl-\, silence or failure; the hang doctor's dumps
    # and telemetry's readers load then (xrun.launch.doctor.dumps), not at each of a fan-out's agents' start
    readers = ("xrun.launch.doctor.dumps", "xrun.launch.doctor.stackdump", "xrun.launch.telemetry.reads",
               "xrun.common.telemetry.records", "xrun.launch.telemetry.client", "xrun.common.result.stacks",
               "xrun.common.result.stackview", "xrun.common.result.collectiveview", "xrun.common.result.stragglers")
    # what a plain job's agent uses only on some node or with some flag loads there: the store's server on rank 0's
    # node, torchft's Lighthouse with --replica_groups, the rendezvous (and the rank plan) with --elastic's endpoint
    unused = ("xrun.launch.store.server", "xrun.launch.replicas.lighthouse", "xrun.parent_death",
              "xrun.common.rdzv", "xrun.common.rankplan")
    # what python -m xrun.launch --connect loads
    assert loaded_by("import xrun.common.procs.posix, xrun.launch.session.main", readers + unused) == []


def test_the_local_runs_start_loads_no_tls_no_reader_and_no_record():
    # issue 38's speed bound (xrun examples/hello.py within +10% of 53c4e3f): the one-node job's head and node load
    # what a job without samples, dumps, TLS, --log_dir or --metrics_port uses; the rest loads at its first use
    unused = ("ssl", "xrun.channel.tls", "xrun.channel.tlspipe", "xrun.common.telemetry.records",
              "xrun.runner.job.record.head", "xrun.common.result.stacks", "xrun.common.result.collectiveview")
    assert loaded_by("import xrun.joined.entry, xrun.joined.one_node", unused) == []


# -- folders by concept (issue 21) --------------------------------------------------------------------------------
# Each layer's units, lowest first: a unit may import (at module level, or for type checking) only units of a
# lower or the same rank; function-level imports count the same (issue 30 §6). A folder is one unit; a top-level
# module of a layer is a unit of its own. The head's backend registry (backends/__init__) is the planner's to ask,
# so it ranks with the plan, below the backends it names (it loads them lazily). Pod mode is one folder whose
# modules sit at two ranks: what the request and the plan need of it (its flags, the platform's variables, the
# placement, the plan digest, the shared secret) with the plan, which names them; the rest (node 0's server, its
# hello policy) above the job, which it runs. A module named in RANKS is a unit of its own.
POD_PLANNING = ("xrun.runner.pod.options", "xrun.runner.pod.platforms", "xrun.runner.pod.placement",
                "xrun.runner.pod.digest", "xrun.runner.pod.secret")
RANKS = {
    "xrun.common": [
        {"xrun.common.procs", "xrun.common.spec", "xrun.common.rankplan", "xrun.common.rdzv", "xrun.common.telemetry",
         "xrun.common.network", "xrun.common.preload"},
        {"xrun.common.output"},
        {"xrun.common.result"},
        {"xrun.common.ranks"},
        {"xrun.common.command", "xrun.common.preflight", "xrun.common.agent_cli"},
    ],
    "xrun.launch": [
        {"xrun.launch.procs", "xrun.launch.network", "xrun.launch.telemetry", "xrun.launch.preload",
         "xrun.launch.store", "xrun.launch.replicas"},
        {"xrun.launch.ranks"},
        {"xrun.launch.doctor"},
        {"xrun.launch.elastic"},
        {"xrun.launch.agent", "xrun.launch.engine_env", "xrun.launch.check_probe"},
        {"xrun.launch.session"},
    ],
    "xrun.runner": [
        {"xrun.runner.hosts", "xrun.runner.torchrun"},
        {"xrun.runner.plan", "xrun.runner.remote_options", "xrun.runner.envpass", "xrun.runner.restart_options",
         "xrun.runner.ssh_connections", "xrun.runner.backends.__init__", "xrun.runner.metrics_options",
         "xrun.runner.replica_options", *POD_PLANNING},
        {"xrun.runner.network", "xrun.runner.report", "xrun.runner.replicas"},
        {"xrun.runner.job"},
        {"xrun.runner.pod"},
        {"xrun.runner.backends"},
        {"xrun.runner.cli", "xrun.runner.planner", "xrun.runner.dryrun", "xrun.runner.validate", "xrun.runner.check"},
    ],
}
LAYER_PACKAGES = set(RANKS) | {"xrun.channel"}


def unit_of(module: str) -> str:
    """The unit a module belongs to: itself when RANKS names it or it is a layer's top-level module, else its
    layer's folder."""
    if module == "xrun.runner.backends":
        return "xrun.runner.backends.__init__"
    if module in POD_PLANNING:
        return module
    parts = module.split(".")
    layer = ".".join(parts[:2])
    if layer not in RANKS or len(parts) < 3:
        return module
    folder = ".".join(parts[:3])
    return folder if (PACKAGE.parent / folder.replace(".", "/") / "__init__.py").exists() else module


def rank_of(unit: str) -> int:
    layer = ".".join(unit.split(".")[:2])
    for rank, units in enumerate(RANKS[layer]):
        if unit in units:
            return rank
    raise AssertionError(f"{unit} is in no rank of tests/test_layers.py's RANKS: give it its place")


def test_every_module_of_a_layer_has_its_place():
    for module in all_modules():
        if ".".join(module.split(".")[:2]) in RANKS and module not in RANKS and not is_entry(module):
            rank_of(unit_of(module))


def test_folders_depend_one_way():
    upward = []
    for edge in layer_edges():
        if edge.target not in all_modules():  # function-level imports count too (issue 30 §6)
            continue
        source, target = unit_of(edge.source), unit_of(edge.target)
        layer = ".".join(source.split(".")[:2])
        if layer not in RANKS or source == target or not target.startswith(layer + ".") or target == layer:
            continue
        if rank_of(target) > rank_of(source):
            upward.append(f"{edge.source} -> {edge.target}")
    assert upward == []


def test_the_channel_imports_no_layer():
    bad = [e for e in import_edges() if e.source.startswith("xrun.channel") and e.target.startswith(("xrun.runner", "xrun.launch", "xrun.common"))]  # noqa: E501
    assert bad == []


def test_shared_modules_import_no_layer():
    # errors, printable, strict_numbers, hostlist, net, shell, ...: below the channel and the three layers (``python -m xrun`` is the entry,
    # xrun.joined sits above the layers)
    shared = [m for m in all_modules() if m.count(".") == 1 and m not in LAYER_PACKAGES | {"xrun.__main__", JOINED}]
    assert "xrun.errors" in shared
    layers = tuple(LAYER_PACKAGES) + tuple(p + "." for p in LAYER_PACKAGES)
    bad = [e for e in import_edges() if e.source in shared and e.target.startswith(layers)]
    assert bad == []


def test_every_folder_says_what_it_is_for():
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc, f"{init.relative_to(PACKAGE.parent)} has no docstring saying what the folder is for"
