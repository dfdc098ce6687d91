"""A griffe extension for the API page (``docs/api.md``), used by mkdocstrings (``mkdocs.yml``).

Two things the package's docstrings and lazy public face need, so the site builds without a
warning and nothing in ``flyexplore/`` changes for the docs:

- The docstrings cross-reference in Sphinx's roles (``:func:`sweep```, ``:data:`~a.b.C```). Each
  role becomes a Markdown code span of the name it shows (the last part after ``~``), which
  Markdown renders as code and autorefs leaves alone.
- Constants are documented Sphinx-style, by ``#:`` comment lines right above the assignment,
  which griffe does not read: those lines become the attribute's docstring, so the API page shows
  each constant with its value and where it comes from.
- ``flyexplore/__init__.py`` imports its public names on first use (its ``_API`` table: name ->
  defining module), so a static reading of the package sees none of them. Each name is added to
  the ``flyexplore`` module as an alias of the object that defines it, in the order of
  ``__all__``, so ``::: flyexplore.sweep`` renders ``fx.sweep``.
"""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import griffe

#: ``:role:`target``` or ``:domain:role:`target``` (Sphinx's cross-reference roles).
ROLE = re.compile(r":(?:py:)?(?:func|meth|class|mod|data|attr|obj|exc|const|ref|term):`([^`]+)`")


def _shown(target: str) -> str:
    target = target.strip()
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"`{target}`"


def markdown_roles(text: str) -> str:
    """``text`` with every Sphinx role turned into a Markdown code span of the name it shows."""
    return ROLE.sub(lambda m: _shown(m.group(1)), text)


@functools.lru_cache(maxsize=None)
def _source_lines(path: str) -> tuple[str, ...]:
    return tuple(Path(path).read_text().splitlines())


def comment_docstring(lines: tuple[str, ...] | list[str], lineno: int) -> str | None:
    """The ``#:`` comment block right above line ``lineno`` (1-based), as text; ``None`` if none."""
    block = []
    i = lineno - 2
    while i >= 0 and lines[i].strip().startswith("#:"):
        block.append(lines[i].strip()[2:].strip())
        i -= 1
    return "\n".join(reversed(block)) or None


def _public_table(pkg: griffe.Module) -> dict[str, str]:
    # the literal dict of flyexplore/__init__.py's _API, read from its source (never imported)
    tree = ast.parse(pkg.filepath.read_text())
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == "_API":
            table: dict[str, str] = {}
            for key, value in zip(node.value.keys, node.value.values):
                if key is None:  # **dict.fromkeys((names...), module)
                    names, module = value.args
                    table.update(dict.fromkeys(ast.literal_eval(names), ast.literal_eval(module)))
                else:
                    table[ast.literal_eval(key)] = ast.literal_eval(value)
            return table
    raise RuntimeError(f"no _API table in {pkg.filepath}")


class FlyexploreDocstrings(griffe.Extension):
    """Sphinx roles as code spans; the lazy public names as aliases on ``flyexplore``."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is None and obj.is_attribute and obj.lineno and isinstance(obj.filepath, Path):
            text = comment_docstring(_source_lines(str(obj.filepath)), obj.lineno)
            if text:
                obj.docstring = griffe.Docstring(text, lineno=obj.lineno, parent=obj)
        if obj.docstring is not None:
            obj.docstring.value = markdown_roles(obj.docstring.value)

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs) -> None:
        if pkg.name != "flyexplore":
            return
        for name, module in sorted(_public_table(pkg).items()):
            pkg.set_member(name, griffe.Alias(name, f"flyexplore.{module}.{name}", parent=pkg))
