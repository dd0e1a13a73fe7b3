"""No module of src/ imports itself back through others: the import graph has no circle.

Every module under src/ is read: the packages (their ``__init__``), their modules and the
top-level modules (``bootstrap``, ``config``, ``serving``, ...). Each is parsed with `ast`
and every import statement counts wherever it stands: at module level, inside a function
(a lazy import) and under ``if TYPE_CHECKING:``. A type-only import is no runtime circle,
but it still makes two modules depend on each other: neither can be read, tested or moved
without the other, and it turns into a runtime circle as soon as someone needs the name at
run time. Relative imports are resolved against the importing module's package.

An edge goes to the module named: ``import a.b.c`` and ``from a.b import c`` (``c`` a module)
give ``a.b.c``, ``from a.b import name`` gives ``a.b``. The parent packages Python imports on
the way (``a``, ``a.b``) are not edges: a package's ``__init__`` may import its own modules.
Imports of modules outside src/ are left out, and so are imports by string
(``importlib.import_module``), which this reading cannot see.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def module_names(src: Path) -> dict[str, Path]:
    """Dotted name -> file of every module under `src` (a package is its ``__init__.py``)."""
    names = {}
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts and all(part.isidentifier() for part in parts):
            names[".".join(parts)] = path
    return names


def imported_modules(module: str, is_package: bool, source: str, known: set[str]) -> set[str]:
    """The modules of `known` that `module`'s source imports, by any import statement in it."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".") if package else []
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                submodule = f"{base}.{alias.name}" if base else alias.name
                found.add(submodule if submodule in known else base)
    return {name for name in found if name in known and name != module}


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the modules of src/ it imports."""
    names = module_names(src)
    known = set(names)
    return {
        name: imported_modules(name, path.name == "__init__.py", path.read_text(encoding="utf-8"), known)
        for name, path in names.items()
    }


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One circle per group of modules that import each other (a strongly connected
    component, Tarjan's algorithm), as ``[a, b, ..., a]``; none for an acyclic graph."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for start in sorted(edges):
        if start not in index:
            connect(start)
    return sorted(_circle_in(group, edges) for group in groups)


def _circle_in(group: set[str], edges: dict[str, set[str]]) -> list[str]:
    """A shortest circle through the group's first module, staying inside the group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(edges.get(node, set()) & group):
                if nxt == start:
                    return [*paths[node], start]
                if nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no circle in {sorted(group)}")  # a component of 2+ always has one


def test_no_module_of_src_imports_itself_back() -> None:
    found = cycles(import_graph())
    assert not found, "import circles in src/:\n" + "\n".join(" -> ".join(circle) for circle in found)


def test_the_graph_covers_all_of_src() -> None:
    edges = import_graph()
    for module in ("bootstrap", "config", "serving", "demo", "domain", "adapters.outbound", "stub", "stub.cli"):
        assert module in edges, module
    assert any("stub.cli" in imported for imported in edges.values())  # the gateway's `gateway stub`


def test_every_kind_of_import_is_an_edge() -> None:
    known = {"pkg", "pkg.b", "pkg.c", "pkg.sub", "pkg.sub.a", "pkg.sub.d", "pkg.sub.e", "pkg.sub.x", "top"}
    source = """
import top
from typing import TYPE_CHECKING
from . import a
from ..b import Name
from pkg import c as cee
from pkg.sub import helper
if TYPE_CHECKING:
    from pkg.sub.e import Other

def later():
    import pkg.sub.d
"""
    imported = imported_modules("pkg.sub.x", False, source, known)
    assert imported == {"top", "pkg.sub.a", "pkg.b", "pkg.c", "pkg.sub", "pkg.sub.e", "pkg.sub.d"}


def test_relative_imports_resolve_against_the_package() -> None:
    known = {"pkg", "pkg.a", "pkg.sub", "pkg.sub.b", "pkg.sub.c"}
    # in a module "." is its package; in a package's __init__ "." is the package itself
    assert imported_modules("pkg.sub.c", False, "from . import b\nfrom .. import a", known) == {"pkg.sub.b", "pkg.a"}
    assert imported_modules("pkg.sub", True, "from . import b\nfrom .c import x", known) == {"pkg.sub.b", "pkg.sub.c"}
    assert imported_modules("pkg.sub.c", False, "from .b import x\nfrom ..sub import b", known) == {"pkg.sub.b"}


def test_the_circle_finder_names_each_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    two = {"a": {"b"}, "b": {"a", "c"}, "c": set(), "x": {"y"}, "y": {"z"}, "z": {"x", "y"}}
    assert cycles(two) == [["a", "b", "a"], ["x", "y", "z", "x"]]
