"""The `redis_gate` package imports in one direction only (`ledger`, `tickets`, `background`
and `connection` once imported each other in a circle). Every import statement counts,
`if TYPE_CHECKING:` ones included: grimp reads them all."""

from __future__ import annotations

import grimp

PACKAGE = "adapters.outbound.redis_gate"
# lower layers first; a module may import only from layers below its own
LAYERS = [{"scripts", "connection"}, {"upstream"}, {"ledger"}, {"leases"}, {"tickets", "background"}, {"gate"}]


def _graph() -> dict[str, set[str]]:
    graph = grimp.build_graph("adapters", include_external_packages=False)
    modules = {m for m in graph.find_descendants(PACKAGE)}
    return {m: {d for d in graph.find_modules_directly_imported_by(m) if d in modules} for m in modules}


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        state[node] = 2
        path.pop()
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


def test_the_redis_gate_package_has_no_import_cycle() -> None:
    edges = _graph()
    assert f"{PACKAGE}.ledger" in edges and f"{PACKAGE}.tickets" in edges
    assert _cycle(edges) is None, " -> ".join(_cycle(edges) or [])


def test_each_module_imports_only_from_lower_layers() -> None:
    rank = {f"{PACKAGE}.{name}": i for i, layer in enumerate(LAYERS) for name in layer}
    edges = _graph()
    assert set(rank) == set(edges) - {PACKAGE}, "a new module: give it a layer here"
    for module, imported in edges.items():
        if module == PACKAGE:
            continue  # the package's __init__ re-exports the top
        for target in imported:
            assert rank[target] < rank[module], f"{module} imports {target}"


def test_the_cycle_finder_finds_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
