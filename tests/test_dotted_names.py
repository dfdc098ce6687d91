"""Every dotted ``flyexplore.x.y.z`` name that a string in flyexplore/ shows a user (help texts,
notes, docstrings, error messages) names something that exists: a newcomer who types it into
``import`` or ``help()`` finds it. (A note once named
``flyexplore.ops.attention.aotriton_ab.ab_view``; the function is
``flyexplore.results.aotriton_ab.ab_view``.)"""
import ast
import importlib
import re

from conftest import ROOT

_NAME = re.compile(r"\bflyexplore(?:\.[A-Za-z_]\w*)+")


def dotted_names() -> dict[str, set[str]]:
    """``{dotted name: {files whose string constants hold it}}`` over flyexplore/*.py (string
    literals, f-string parts and docstrings alike)."""
    out: dict[str, set[str]] = {}
    for f in sorted((ROOT / "flyexplore").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for m in _NAME.findall(node.value):
                    out.setdefault(m, set()).add(str(f.relative_to(ROOT)))
    return out


def resolves(name: str) -> bool:
    """True when ``name`` is a module, or a module's attribute chain (the longest importable
    prefix is imported, the rest looked up by getattr)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        mod = ".".join(parts[:i])
        try:
            obj = importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name is not None and mod.startswith(exc.name):
                continue   # not a module (or a parent is not): try a shorter prefix
            raise
        for p in parts[i:]:
            if not hasattr(obj, p):
                return False
            obj = getattr(obj, p)
        return True
    return False


def test_resolver_tells_real_names_from_made_up_ones():
    assert resolves("flyexplore.results.aotriton_ab.ab_view")
    assert resolves("flyexplore.measure.stats.MARKS")
    assert not resolves("flyexplore.ops.attention.aotriton_ab.ab_view")
    assert not resolves("flyexplore.results.aotriton_ab.no_such_view")


def test_every_dotted_flyexplore_name_in_a_string_resolves():
    names = dotted_names()
    assert len(names) > 100   # the scan found the package's own cross references
    bad = {n: sorted(fs) for n, fs in sorted(names.items()) if not resolves(n)}
    assert not bad, f"dotted names that do not exist: {bad}"
