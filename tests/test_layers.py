"""The layers of DESIGN §1 hold in the import graph: engine <- ipc <- workers <- tools.

Every module under engine/ ipc/ workers/ tools/ (and pyspark_mqstore.py) is parsed, not
imported, and every import statement is read: absolute and relative, at module level, inside
functions and under TYPE_CHECKING. An import counts as one of the deepest module it names
(`from ipc import seqlock` is of ipc.seqlock); the parent packages it also runs are left out,
which is sound because a package's __init__ imports nothing (test_packages_re_export_nothing;
ALLOWED_FACADES: the record codec, whose __init__ is its API).
A failure names the importing module, the imported module and the rule it breaks. The last
tests run the checker over a tiny tree in tmp_path, so a checker that caught nothing fails.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("engine", "ipc", "workers", "tools")  # lowest first: a layer imports only those before it
TOP_MODULES = {"pyspark_mqstore": "tools"}  # top-level modules and the layer they belong to
# Third-party packages each layer may import (DESIGN §1); a layer may also use what a lower one may.
OWN_THIRD_PARTY = {"engine": {"numpy", "crc32c"}, "ipc": {"posix_ipc"}, "workers": {"psutil"}}
UNLIMITED_LAYERS = {"tools"}  # the command line, the load test and the Spark pipeline import anything

# Inside ipc: shared-memory primitives, which the supervisor, its children and clients all use,
# and the client side of co-located producers and consumers. A primitive never imports the client
# side and neither does workers/: the supervisor serves clients and never acts as one.
IPC_PRIMITIVES = {
    "ipc.shm", "ipc.seqlock", "ipc.slot_claim", "ipc.control_block", "ipc.retention_block",
    "ipc.mailbox", "ipc.wakeup", "ipc.key_ring", "ipc.run_info", "ipc.put_latency",
    "ipc.offset_table_codec", "ipc.refused_offsets",  # file records the supervisor reads at start
    "ipc.offsets_fallbacks",  # a file record, not shared memory: the status reads it as the clients write it
    "ipc.topic_requests",  # request files the CLI writes and the supervisor answers
    "ipc.deleted_topic_offsets",  # the supervisor's part of a topic delete
}
IPC_CLIENT = {
    "ipc.producer", "ipc.one_message", "ipc.slot_sender", "ipc.batch_result", "ipc.reattach", "ipc.consumer",
    "ipc.consumer_offsets", "ipc.store_log", "ipc.group_members", "ipc.group_roster", "ipc.queue_locks",
    "ipc.queue_allocation", "ipc.group_share", "ipc.async_producer", "ipc.async_consumer",
}

# Cycles other branches of issue 21 remove; the integrator empties this list after merging them
# (test_allowed_cycles_still_exist fails once a listed cycle is gone).
ALLOWED_CYCLES: set[frozenset[str]] = set()
# The record codec is one package whose __init__ is its public API: the layout and the scalar
# reference codec, imported as `engine.formats.record` by most of the code.
ALLOWED_FACADES = {"engine.formats.record"}

UPWARD = "a layer imports only the layers below it (DESIGN §1: engine <- ipc <- workers <- tools)"
CYCLE = "no two modules import each other, directly or through others (DESIGN §1)"
FACADE = "a package's __init__ is its docstring only: import a name from the module defining it"
IPC_CLIENT_RULE = "ipc primitives and workers/ never import the ipc client side (tests/test_layers.py)"
UNCLASSIFIED = "every ipc module is listed as a primitive or as client side in tests/test_layers.py"


@dataclass(frozen=True)
class Import:
    """One import in `importer`: of a module of the tree (`internal`), or of a top-level
    stdlib or third-party name."""

    importer: str
    imported: str
    line: int
    internal: bool

    def broken(self, rule: str) -> str:
        return f"{self.importer} imports {self.imported} (line {self.line}): {rule}"


@dataclass(frozen=True)
class Tree:
    """The modules of a source tree (dotted name -> file) and every import in them."""

    modules: dict[str, Path]
    imports: list[Import]

    def edges(self) -> dict[str, set[str]]:
        """importer -> the modules of the tree it imports (itself left out)."""
        out: dict[str, set[str]] = {name: set() for name in self.modules}
        for imp in self.imports:
            if imp.internal and imp.imported != imp.importer:
                out[imp.importer].add(imp.imported)
        return out


def layer_of(module: str) -> str:
    top = module.partition(".")[0]
    return TOP_MODULES.get(top, top)


def find_modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file for every module of the layers (a package by its __init__)."""
    modules = {}
    for package in LAYERS:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for name in TOP_MODULES:
        if (root / f"{name}.py").exists():
            modules[name] = root / f"{name}.py"
    return modules


def read_tree(root: Path) -> Tree:
    modules = find_modules(root)
    imports = [imp for name, path in modules.items() for imp in module_imports(name, path, modules)]
    return Tree(modules, imports)


def module_imports(name: str, path: Path, modules: dict[str, Path]) -> Iterator[Import]:
    """Every import in the module `name`, wherever it stands in the file."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield resolve(name, alias.name, node.lineno, modules)
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            base = from_base(name, is_package, node)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                yield resolve(name, submodule if submodule in modules else base, node.lineno, modules)


def from_base(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The module a `from ... import` reads from, a relative one resolved against `importer`."""
    if node.level == 0:
        return node.module or ""
    package = importer if is_package else importer.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return ".".join(part for part in (package, node.module) if part)


def resolve(importer: str, dotted: str, line: int, modules: dict[str, Path]) -> Import:
    """The deepest module of the tree that `dotted` names, or its top-level name if outside."""
    name = dotted
    while name and name not in modules:
        name = name.rpartition(".")[0]
    if name:
        return Import(importer, name, line, internal=True)
    return Import(importer, dotted.partition(".")[0], line, internal=False)


# -- the rules -------------------------------------------------------------------------------------

def upward_imports(tree: Tree) -> list[str]:
    return [imp.broken(UPWARD) for imp in tree.imports
            if imp.internal and LAYERS.index(layer_of(imp.imported)) > LAYERS.index(layer_of(imp.importer))]


def allowed_third_party(layer: str) -> set[str]:
    allowed: set[str] = set()
    for lower in LAYERS[:LAYERS.index(layer) + 1]:
        allowed |= OWN_THIRD_PARTY.get(lower, set())
    return allowed


def third_party_rule(layer: str) -> str:
    allowed = ", ".join(sorted(allowed_third_party(layer)))
    return f"{layer} imports the stdlib and only these third-party packages: {allowed} (DESIGN §1)"


def foreign_imports(tree: Tree) -> list[str]:
    """Third-party imports a layer may not make."""
    out = []
    for imp in tree.imports:
        layer = layer_of(imp.importer)
        if imp.internal or layer in UNLIMITED_LAYERS or imp.imported in sys.stdlib_module_names:
            continue
        if imp.imported not in allowed_third_party(layer):
            out.append(imp.broken(third_party_rule(layer)))
    return out


def import_cycles(edges: dict[str, set[str]]) -> list[set[str]]:
    """Each set of modules that import each other, directly or through others (a strongly
    connected component of more than one module)."""
    return [component for component in components(edges) if len(component) > 1]


def components(edges: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components, iterative so that no import chain is too long for
    the recursion limit."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            child = next(successors, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    found.append(component)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def cycle_through(component: set[str], edges: dict[str, set[str]]) -> list[str]:
    """A shortest cycle from the component's first module back to itself (breadth first)."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(edges[node] & component):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"{sorted(component)} is not a cycle")


def cycle_breaks(tree: Tree, allowed: set[frozenset[str]]) -> list[str]:
    """One line per set of modules that import each other: a cycle through it, and the whole set
    when it is larger than that cycle."""
    edges, out = tree.edges(), []
    for component in import_cycles(edges):
        if frozenset(component) in allowed:
            continue
        cycle = cycle_through(component, edges)
        line = f"{cycle[0]} imports {cycle[1]}: import cycle {' -> '.join(cycle)}"
        if len(component) > len(cycle) - 1:
            line += f" (in a knot of {len(component)}: {', '.join(sorted(component))})"
        out.append(f"{line}: {CYCLE}")
    return out


def facades(tree: Tree, allowed: set[str]) -> list[str]:
    return [imp.broken(FACADE) for imp in tree.imports
            if tree.modules[imp.importer].name == "__init__.py" and imp.importer not in allowed]


def ipc_client_imports(tree: Tree) -> list[str]:
    return [imp.broken(IPC_CLIENT_RULE) for imp in tree.imports
            if imp.imported in IPC_CLIENT
            and (imp.importer in IPC_PRIMITIVES or layer_of(imp.importer) == "workers")]


# -- the tree of this repository -------------------------------------------------------------------

TREE = read_tree(REPO_ROOT)


def test_the_walk_sees_every_package_and_its_imports():
    assert {layer_of(name) for name in TREE.modules} == set(LAYERS)
    seen = {(imp.importer, imp.imported) for imp in TREE.imports}
    assert ("workers.index_builder", "workers.step_window") in seen  # a module-level import
    assert ("engine.files.mapped_file", "engine.files.open_files") in seen  # under TYPE_CHECKING
    assert ("tools.bench.loadgen", "tools.bench.mqstore_client") in seen  # inside a function


def test_no_layer_imports_a_higher_one():
    assert upward_imports(TREE) == []


def test_each_layer_imports_only_its_third_party_packages():
    assert foreign_imports(TREE) == []


def test_no_import_cycles():
    assert cycle_breaks(TREE, ALLOWED_CYCLES) == []


def test_allowed_cycles_still_exist():
    """An allowed cycle that was broken leaves the list, so a new one cannot hide behind it."""
    present = {frozenset(component) for component in import_cycles(TREE.edges())}
    assert sorted(sorted(cycle) for cycle in ALLOWED_CYCLES - present) == []


def test_packages_re_export_nothing():
    assert facades(TREE, ALLOWED_FACADES) == []


def test_every_ipc_module_is_a_primitive_or_client_side():
    ipc_modules = {name for name in TREE.modules if layer_of(name) == "ipc" and name != "ipc"}
    assert sorted(f"{name}: {UNCLASSIFIED}" for name in ipc_modules - IPC_PRIMITIVES - IPC_CLIENT) == []
    assert sorted(IPC_PRIMITIVES & IPC_CLIENT) == []
    assert sorted((IPC_PRIMITIVES | IPC_CLIENT) - ipc_modules) == []  # a listed module that is gone


def test_the_supervisor_side_never_imports_the_ipc_client():
    assert ipc_client_imports(TREE) == []


# -- the checker catches what it should (a synthetic tree) ----------------------------------------

def write_tree(root: Path, files: dict[str, str]) -> Tree:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for package in LAYERS:
        (root / package).mkdir(exist_ok=True)
        (root / package / "__init__.py").touch()
    return read_tree(root)


def test_checker_names_an_upward_import_wherever_it_stands(tmp_path):
    tree = write_tree(tmp_path, {
        "ipc/ring.py": "",
        "workers/boss.py": "",
        "tools/cli.py": "",
        "engine/top.py": "import ipc.ring\n",
        "engine/typed.py": "import typing\nif typing.TYPE_CHECKING:\n    from workers import boss\n",
        "engine/late.py": "def f():\n    from tools.cli import main\n    return main\n",
    })
    assert sorted(upward_imports(tree)) == [
        f"engine.late imports tools.cli (line 2): {UPWARD}",
        f"engine.top imports ipc.ring (line 1): {UPWARD}",
        f"engine.typed imports workers.boss (line 3): {UPWARD}",
    ]


def test_checker_names_a_cycle_and_its_path(tmp_path):
    tree = write_tree(tmp_path, {
        "engine/a.py": "from engine import b\n",
        "engine/b.py": "def f():\n    from .sub import c\n",
        "engine/sub/__init__.py": "",
        "engine/sub/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .. import a\n",
        "engine/d.py": "import engine.a\n",
    })
    assert cycle_breaks(tree, set()) == [f"engine.a imports engine.b: import cycle "
                                         f"engine.a -> engine.b -> engine.sub.c -> engine.a: {CYCLE}"]
    assert cycle_breaks(tree, {frozenset({"engine.a", "engine.b", "engine.sub.c"})}) == []
    (tmp_path / "engine/d.py").write_text("import engine.a\nfrom engine.sub import c\n")
    (tmp_path / "engine/a.py").write_text("from engine import b, d\n")
    assert cycle_breaks(read_tree(tmp_path), set()) == [
        f"engine.a imports engine.d: import cycle engine.a -> engine.d -> engine.a "
        f"(in a knot of 4: engine.a, engine.b, engine.d, engine.sub.c): {CYCLE}"]


def test_checker_names_a_forbidden_third_party_import(tmp_path):
    tree = write_tree(tmp_path, {
        "engine/fast.py": "import numpy as np\nimport crc32c\nimport os.path\n",
        "engine/shm.py": "import posix_ipc\n",
        "ipc/ring.py": "import posix_ipc\nimport psutil\n",
        "workers/boss.py": "import psutil\nimport pyarrow\n",
        "tools/spark.py": "import pyarrow\n",
    })
    assert sorted(foreign_imports(tree)) == [
        f"engine.shm imports posix_ipc (line 1): {third_party_rule('engine')}",
        f"ipc.ring imports psutil (line 2): {third_party_rule('ipc')}",
        f"workers.boss imports pyarrow (line 2): {third_party_rule('workers')}",
    ]
    assert third_party_rule("ipc").endswith("crc32c, numpy, posix_ipc (DESIGN §1)")


def test_checker_names_a_facade_and_a_client_import_on_the_supervisor_side(tmp_path):
    tree = write_tree(tmp_path, {
        "ipc/__init__.py": "from ipc.shm import Region\n",
        "ipc/shm.py": "class Region: ...\n",
        "ipc/producer.py": "from ipc.shm import Region\n",
        "ipc/mailbox.py": "from .producer import send\n",
        "workers/supervisor.py": "from ipc import producer\n",
    })
    assert facades(tree, set()) == [f"ipc imports ipc.shm (line 1): {FACADE}"]
    assert sorted(ipc_client_imports(tree)) == [
        f"ipc.mailbox imports ipc.producer (line 1): {IPC_CLIENT_RULE}",
        f"workers.supervisor imports ipc.producer (line 1): {IPC_CLIENT_RULE}",
    ]
