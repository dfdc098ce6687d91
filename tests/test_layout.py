"""The package's shape (issue 15): no import cycle among flyexplore's modules (lazy imports inside
functions included), no module over about 800 lines, README's layout section matching the tree,
a deliberate public API, and the measuring core free of UI code."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

from conftest import ROOT

PKG = Path(ROOT) / "flyexplore"
MAX_LINES = 800


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def import_graph() -> nx.DiGraph:
    """Module -> module edges of every ``import`` / ``from ... import`` in flyexplore, at any
    depth (a function's lazy import is a dependency too)."""
    mods = _modules()
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(p.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom):
                base = pkg
                for _ in range(node.level - 1):
                    base = base.rsplit(".", 1)[0]
                mod = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            g.add_edges_from((m, t) for t in targets if t in mods and t != m)
    return g


def test_no_import_cycle():
    g = import_graph()
    assert g.has_edge("flyexplore.run.cases", "flyexplore.insight.trace")      # the graph sees real edges
    cycles = list(nx.simple_cycles(g))
    assert cycles == [], [" -> ".join(c + [c[0]]) for c in cycles[:10]]


def test_the_cycle_check_catches_a_lazy_import_cycle(tmp_path, monkeypatch):
    pkg = tmp_path / "flyexplore"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import x\n")
    monkeypatch.setattr(sys.modules[__name__], "PKG", pkg)
    assert list(nx.simple_cycles(import_graph())) in ([["flyexplore.a", "flyexplore.b"]],
                                                     [["flyexplore.b", "flyexplore.a"]])


def test_no_module_over_800_lines():
    big = {m: n for m, p in _modules().items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert big == {}


def test_readme_layout_matches_the_tree():
    text = (Path(ROOT) / "README.md").read_text()
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```\n(.*?)```", section, re.S).group(1)
    listed, folder = set(), []
    for line in block.splitlines():
        name = line.strip().split()[0] if line.strip() else ""
        depth = (len(line) - len(line.lstrip())) // 2
        if name.endswith("/"):
            folder = folder[:depth] + [name.rstrip("/")]
        elif name.endswith(".py"):
            listed.add("/".join(folder[:depth] + [name]))
    tree = {str(p.relative_to(PKG.parent)) for p in PKG.rglob("*.py")}
    assert listed == tree, (sorted(tree - listed), sorted(listed - tree))


def test_public_api_is_deliberate_and_light():
    code = ("import sys, flyexplore as F\n"
            "assert 'torch' not in sys.modules and 'pandas' not in sys.modules\n"
            "missing = [n for n in F.__all__ if getattr(F, n, None) is None]\n"
            "assert not missing, missing\n"
            "from flyexplore import explain, trace, xray\n"
            "assert callable(explain.explain) and callable(trace.trace) and callable(xray.xray)\n"
            "print(len(F.__all__))\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    import flyexplore

    assert "register_op" in flyexplore.__all__ and "run_sweep" in flyexplore.__all__
    with pytest.raises(AttributeError):
        flyexplore.no_such_name  # noqa: B018


def test_measuring_core_never_imports_ui_code():
    g = import_graph()
    core = ["flyexplore.measure.timing", "flyexplore.measure.interleaved", "flyexplore.measure.stats", "flyexplore.measure.devstate",
            "flyexplore.run.cases", "flyexplore.run.sweep", "flyexplore.run.engine", "flyexplore.results.table"]
    ui = {"flyexplore.ui.widgets", "flyexplore.ui.panel", "flyexplore.ui.panel_parts", "flyexplore.ui.inspector",
          "flyexplore.ui.widget_base", "flyexplore.views.plots", "flyexplore.views.plots_compare", "flyexplore.views.plot_style",
          "flyexplore.views.report"}
    reached = {m: sorted(nx.descendants(g, m) & ui) for m in core}
    assert all(not v for v in reached.values()), reached
