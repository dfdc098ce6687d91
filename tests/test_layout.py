"""The package's floor plan (issue 20): folders by layer, imports only going down (import-linter's
``layers`` contract in pyproject.toml, run here), at most ten modules at the root, lazy imports of
flyexplore only where they keep torch/pandas/plotly off a light path, docs/architecture.md's file
tree matching the real one, and one light public face (``import flyexplore as fx``)."""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from conftest import ROOT

PKG = Path(ROOT) / "flyexplore"
LINT = Path(sys.executable).with_name("lint-imports")


def _contract() -> dict:
    conf = tomllib.loads((Path(ROOT) / "pyproject.toml").read_text())["tool"]["importlinter"]
    (c,) = [c for c in conf["contracts"] if c["type"] == "layers"]
    return c


def _layers() -> list[str]:
    return [n.strip() for layer in _contract()["layers"] for n in re.split(r"[|:]", layer)]


def _lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root,
                          capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(root), "PATH": str(LINT.parent)})


def test_lint_imports_keeps_the_layers_contract():
    p = _lint(Path(ROOT))
    assert p.returncode == 0 and "1 kept, 0 broken" in p.stdout, p.stdout[-3000:] + p.stderr[-2000:]


def test_the_contract_catches_an_upward_import_even_inside_a_function(tmp_path):
    shutil.copytree(PKG, tmp_path / "flyexplore", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(Path(ROOT) / "pyproject.toml", tmp_path)
    mod = tmp_path / "flyexplore" / "measure" / "stats.py"
    mod.write_text(mod.read_text() + "\n\ndef _upward():\n    from flyexplore.views import plots  # noqa: F401\n")
    p = _lint(tmp_path)
    assert p.returncode != 0 and "flyexplore.measure is not allowed to import flyexplore.views" in p.stdout, p.stdout[-3000:]


def test_root_holds_at_most_ten_modules_and_every_folder_is_a_layer():
    root_mods = sorted(p.name for p in PKG.glob("*.py"))
    assert len(root_mods) <= 10, root_mods
    layers = set(_layers())
    folders = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders <= layers, sorted(folders - layers)
    for m in root_mods:  # a root module is a layer of its own or the public face's door
        assert m[:-3] in layers | {"__init__", "__main__"}, m


def _lazy_flyexplore_imports() -> list[str]:
    out = []
    for p in sorted(PKG.rglob("*.py")):
        tree = ast.parse(p.read_text())
        top = {id(n) for n in tree.body}
        top |= {id(c) for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)
                for c in n.body}  # typing only: never imported at run time
        for n in ast.walk(tree):
            if id(n) in top:
                continue
            mods = [n.module or ""] if isinstance(n, ast.ImportFrom) else \
                [a.name for a in n.names] if isinstance(n, ast.Import) else []
            if any(m.startswith("flyexplore") for m in mods):
                out.append(f"{p.relative_to(PKG.parent)}:{n.lineno}")
    return out


def test_lazy_imports_of_flyexplore_only_keep_the_command_line_light():
    # the CLI's handlers import their layer when they run, so `flyexplore --help` imports neither
    # torch nor pandas, and the root hands the catalogue's routes to the world layer on first
    # need (`import flyexplore` stays light); everywhere else an import of flyexplore sits at the
    # top of its module
    lazy = [x for x in _lazy_flyexplore_imports()
            if not x.startswith(("flyexplore/cli/", "flyexplore/__init__.py:"))]
    assert lazy == [], lazy


def _listed_modules(block: str) -> set[str]:
    listed, folder = set(), []
    for line in block.splitlines():
        name = line.strip().split()[0] if line.strip() else ""
        depth = (len(line) - len(line.lstrip())) // 2
        if name.endswith("/"):
            folder = folder[:depth] + [name.rstrip("/")]
        elif name.endswith(".py"):
            listed.add("/".join(folder[:depth] + [name]))
    return listed


def test_the_file_tree_in_docs_architecture_matches_the_tree():
    # the one file tree of the project is docs/architecture.md's; README holds none
    text = (Path(ROOT) / "docs" / "architecture.md").read_text()
    section = text.split("## The file tree", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```\n(.*?)```", section, re.S)
    assert len(blocks) == 1, len(blocks)
    listed = _listed_modules(blocks[0])
    tree = {str(p.relative_to(PKG.parent)) for p in PKG.rglob("*.py")}
    assert listed == tree, (sorted(tree - listed), sorted(listed - tree))
    for page in [Path(ROOT) / "README.md", *sorted((Path(ROOT) / "docs").glob("*.md"))]:
        if page.name != "architecture.md":
            assert "  __init__.py" not in page.read_text(), f"{page.name} holds a file tree"


def test_the_tree_check_sees_a_missing_or_extra_module():
    block = "flyexplore/\n  __init__.py\n  measure/\n    stats.py\n  cli/\n    __init__.py\n"
    assert _listed_modules(block) == {"flyexplore/__init__.py", "flyexplore/measure/stats.py",
                                      "flyexplore/cli/__init__.py"}


def test_public_face_is_light_and_its_doors_are_functions():
    code = ("import sys, inspect, flyexplore as fx\n"
            "heavy = [m for m in ('torch', 'pandas', 'plotly') if m in sys.modules]\n"
            "assert not heavy, heavy\n"
            "for n in ('sweep', 'explain', 'trace', 'xray', 'load', 'speedup', 'geomean', 'figure', 'report'):\n"
            "    assert inspect.isfunction(getattr(fx, n)), n\n"
            "missing = [n for n in fx.__all__ if getattr(fx, n, None) is None]\n"
            "assert not missing, missing\n"
            "print(len(fx.__all__))\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    import pytest

    import flyexplore

    with pytest.raises(AttributeError):
        flyexplore.no_such_name  # noqa: B018


def _marked_slow(node) -> bool:
    return any("mark.slow" in ast.unparse(d) for d in getattr(node, "decorator_list", []))


def test_tests_mirror_the_layers_and_the_fast_lane_covers_each():
    # tests/<layer>/ for every folder of the package, each a package of its own (unique conftest
    # and module names), each with tests that `pytest -m "not slow"` runs
    tests = Path(ROOT) / "tests"
    layer_dirs = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    test_dirs = {p.parent.name for p in tests.glob("*/test_*.py")}
    assert test_dirs == layer_dirs, (sorted(layer_dirs - test_dirs), sorted(test_dirs - layer_dirs))
    assert not list(tests.glob("*/*/test_*.py")), "tests/<layer>/ holds its tests without subfolders"
    for d in sorted(test_dirs):
        assert (tests / d / "__init__.py").exists(), d
        fast = []
        for f in sorted((tests / d).glob("test_*.py")):
            tree = ast.parse(f.read_text())
            if any(isinstance(n, ast.Assign) and "pytestmark" in ast.unparse(n.targets[0])
                   and "slow" in ast.unparse(n.value) for n in tree.body):
                continue
            fast += [n.name for n in tree.body if isinstance(n, ast.FunctionDef)
                     and n.name.startswith("test_") and not _marked_slow(n)]
        assert fast, f"tests/{d}/ has no test outside the slow marker"
