"""The package's import graph (issue 15, "Done when"): no import cycles, and ``_backend`` imports
nothing from ``cudnn_compat``.

Every module of ``cudnn_compat/`` and of the repository's ``cudnn_compat/_backend/`` (installed as
``cudnn_compat._backend``) is parsed, not imported.  An edge ``a -> b`` is an import statement of
``a`` that can run: at module level (including under a top-level ``if``, ``try``, ``with`` or
class body) or inside a function, but not under ``if TYPE_CHECKING:``; ``import_graph()`` alone is
the module-level part.
Relative imports are resolved; ``from p import name`` is an edge to ``p.name`` when that is a
module of the package, else to ``p``.  Each cycle found is named, module by module.

The op-kind registry is checked here too: ``cudnn_compat/_backend/ops`` assembles ``OP_SPECS`` from its family
modules, and no module writes into it.
"""
import ast
import pathlib
from types import MappingProxyType

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = {"cudnn_compat": ROOT / "cudnn_compat"}  # cudnn_compat/_backend: the graph layer
BACKEND = "cudnn_compat._backend"


def package_modules() -> dict:
    """Dotted module name -> path, for every .py file of the package (``__init__`` is the package)."""
    out = {}
    for pkg, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((pkg,) + parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def module_level_imports(body: list):
    """The Import/ImportFrom statements that run when the module is imported."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from module_level_imports(node.body)
            yield from module_level_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from module_level_imports(block)
            for handler in node.handlers:
                yield from module_level_imports(handler.body)
        elif isinstance(node, (ast.With, ast.ClassDef)):
            yield from module_level_imports(node.body)


def runnable_imports(node):
    """Every Import/ImportFrom under ``node`` that can run: function and method bodies included,
    ``if TYPE_CHECKING:`` bodies not (an import inside a function is still an edge: a cycle
    through one is a cycle, only deferred)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.orelse:
                yield from runnable_imports(ast.Module(body=[stmt], type_ignores=[]))
        else:
            yield from runnable_imports(child)


def _known(name: str, modules) -> "str | None":
    """The longest prefix of ``name`` that is a module of the package (None: outside it)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_targets(node, name: str, is_package: bool, modules) -> set:
    """The package modules one import statement of module ``name`` loads."""
    if isinstance(node, ast.Import):
        return {t for t in (_known(a.name, modules) for a in node.names) if t}
    if node.level:
        base = name if is_package else name.rpartition(".")[0]
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        source = ".".join(p for p in (base, node.module) if p)
    else:
        source = node.module
    out = set()
    for alias in node.names:
        sub = f"{source}.{alias.name}"
        target = sub if sub in modules else _known(source, modules)
        if target:
            out.add(target)
    return out


def edges(name: str, source: str, is_package: bool, modules, module_level: bool = True) -> set:
    """The package modules that module ``name`` imports (at module level, or anywhere)."""
    tree = ast.parse(source)
    nodes = module_level_imports(tree.body) if module_level else runnable_imports(tree)
    out = set()
    for node in nodes:
        out |= import_targets(node, name, is_package, modules)
    out.discard(name)
    return out


def import_graph(module_level: bool = True) -> dict:
    modules = package_modules()
    return {name: edges(name, path.read_text(), path.name == "__init__.py", modules, module_level)
            for name, path in modules.items()}


def find_cycles(graph: dict) -> list:
    """One cycle [m0, m1, ..., m0] per strongly connected component of more than one module
    (Tarjan's algorithm, iterative), sorted."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.add(w)
                        if w == v:
                            break
                    if len(comp) > 1 or v in graph[v]:
                        components.append(comp)
    return sorted(_cycle_in(graph, comp) for comp in components)


def _cycle_in(graph: dict, comp: set) -> list:
    """A shortest cycle through the smallest module of a strongly connected component."""
    start = min(comp)
    prev, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return [start] + path[::-1][1:] + [start]
                if w in comp and w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")  # pragma: no cover


def describe(cycles: list) -> str:
    return "\n".join("  " + " -> ".join(c) for c in cycles)


# -- the package ------------------------------------------------------------------------------------

def test_no_import_cycles():
    """No cycle among the imports that run, at module level or inside functions (issue 26 item 6:
    an import deferred into a function hides a cycle from a module-level walk, not from the code)."""
    cycles = find_cycles(import_graph(module_level=False))
    assert not cycles, ("import cycles in the package (imports anywhere but under TYPE_CHECKING; break "
                        "each one by moving the shared piece to the module that owns it):\n" + describe(cycles))


def test_backend_imports_nothing_from_cudnn_compat():
    """Anywhere in a module, function bodies included."""
    graph = import_graph(module_level=False)
    bad = {m: sorted(t for t in targets if not t.startswith(BACKEND))
           for m, targets in graph.items() if m.startswith(BACKEND)}
    bad = {m: t for m, t in bad.items() if t}
    assert not bad, f"_backend modules import cudnn_compat: {bad}"


def test_the_walk_sees_the_package():
    graph = import_graph()
    assert len(graph) > 80
    assert "cudnn_compat._backend.ops" in graph["cudnn_compat._backend.ir"]
    assert "cudnn_compat._backend.ops.convolution" in graph["cudnn_compat._backend.engines.reference.conv"]
    assert "cudnn_compat.tools.fuse" in graph["cudnn_compat.tools.trace"]


def test_op_kinds_are_assembled_by_the_ops_package():
    """OP_SPECS is the union of the family modules' KINDS, read-only, each kind with its rule;
    no module assigns into an OP_SPECS or KINDS table (the kinds' one home is their family module)."""
    from cudnn_compat._backend import ops
    assert isinstance(ops.OP_SPECS, MappingProxyType)
    union = {}
    for family in ops.FAMILIES:
        assert not set(family.KINDS) & set(union), family.__name__
        union.update(family.KINDS)
    assert dict(ops.OP_SPECS) == union
    assert all(callable(spec.rule) for spec in union.values())
    writers = []
    for name, path in package_modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for t in targets:
                if isinstance(t, ast.Subscript) and getattr(t.value, "id", getattr(t.value, "attr", "")) in ("OP_SPECS", "KINDS"):
                    writers.append(f"{name}:{node.lineno}")
    assert not writers, f"op-kind tables written from outside their definition: {writers}"


# -- the walk itself, on synthetic graphs -------------------------------------------------------------

def test_find_cycles_names_each_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"g"}, "g": {"f"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"], ["e", "e"], ["f", "g", "f"]]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) == []
    with pytest.raises(AssertionError, match="a -> b -> a"):
        cycles = find_cycles({"a": {"b"}, "b": {"a"}})
        assert not cycles, describe(cycles)


def test_edges_resolve_relative_and_skip_type_checking_and_functions():
    modules = {"p", "p.a", "p.b", "p.c", "p.d", "p.sub", "p.sub.x", "p.e"}
    src = """
import os
from typing import TYPE_CHECKING
from . import a
from .b import thing
from p import c as cee
if TYPE_CHECKING:
    from . import e
else:
    pass
try:
    from .sub import x
except ImportError:
    import p.d
def f():
    from . import e
"""
    assert edges("p.mod", src, False, modules) == {"p.a", "p.b", "p.c", "p.sub.x", "p.d"}
    assert edges("p.mod", src, False, modules, module_level=False) == {"p.a", "p.b", "p.c", "p.sub.x", "p.d", "p.e"}
    assert edges("p.sub", "from .. import a\nfrom . import x\nfrom .x import y\n", True, modules) == {"p.a", "p.sub.x"}
    assert edges("p.sub.x", "from .. import b\nfrom ..c import k\n", False, modules) == {"p.b", "p.c"}


def test_an_introduced_cycle_fails():
    """Two modules that import each other at module level are reported by name."""
    modules = {"q", "q.one", "q.two"}
    graph = {"q": set(), "q.one": edges("q.one", "from . import two\n", False, modules),
             "q.two": edges("q.two", "from .one import f\n", False, modules)}
    assert find_cycles(graph) == [["q.one", "q.two", "q.one"]]
    graph["q.two"] = edges("q.two", "def g():\n    from .one import f\n", False, modules)
    assert find_cycles(graph) == []


def test_generated_python_is_compiled_in_one_place():
    """Issue 26 item 2: ``exec`` and ``compile`` of Python source appear only in
    ``cudnn_compat/_core/generated.py`` (its ``define`` keeps the source for tracebacks and dumps)."""
    home = "cudnn_compat._core.generated"
    found = []
    for name, path in package_modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("exec", "compile"):
                found.append(f"{name}:{node.lineno} {node.func.id}")
    assert found and all(f.startswith(home + ":") for f in found), found
