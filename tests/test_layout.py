"""The package's shape, held by tests: a top level of at most four modules, modules of one idea (at most 400
lines, formatted), and no import cycle, function-level imports included (grimp reads every import statement)."""

from __future__ import annotations

from pathlib import Path

import grimp

PACKAGE = Path(__file__).resolve().parent.parent / "workbench"
MAX_LINES = 400
MAX_TOP_LEVEL = 4


def test_the_top_level_holds_the_public_api_and_errors_only():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, top


def test_no_module_is_over_400_lines():
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    adj = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in adj:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on_stack.add(v)
            if i < len(adj[v]):
                work.append((v, i + 1))
                w = adj[v][i]
                if w not in index:
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            for w in adj[v]:
                if w in on_stack:
                    low[v] = min(low[v], low[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_no_import_cycle_also_through_function_level_imports():
    assert _cycles(grimp.build_graph("workbench", include_external_packages=False)) == []


def test_the_cycle_finder_finds_a_cycle(tmp_path, monkeypatch):
    pkg = tmp_path / "cyclic"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyclic import b\n")
    (pkg / "b.py").write_text("def f():\n    from cyclic import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _cycles(grimp.build_graph("cyclic", cache_dir=None)) == [["cyclic.a", "cyclic.b"]]
