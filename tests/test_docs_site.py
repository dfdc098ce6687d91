"""The docs site (``mkdocs.yml``, pages in ``docs/``): every page is in the navigation and every nav
entry is a page, the API page names every public name, and ``mkdocs build --strict`` succeeds
(broken links or anchors, a page outside the nav, a docstring the API page cannot render: each a
warning, so a failure)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

DOCS = Path(ROOT) / "docs"
CONFIG = Path(ROOT) / "mkdocs.yml"


def _config() -> dict:
    import yaml  # mkdocs depends on PyYAML

    return yaml.safe_load(CONFIG.read_text())


def _nav_pages(nav) -> list[str]:
    pages = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def _pages_on_disk(excluded: tuple[str, ...]) -> set[str]:
    return {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")
            if not str(p.relative_to(DOCS)).startswith(excluded)}


def test_every_nav_entry_is_a_page_and_every_page_is_in_the_nav():
    conf = _config()
    assert conf["strict"] is True and conf["docs_dir"] == "docs"
    assert conf["theme"]["name"] == "material" and conf["theme"]["font"] is False  # no Google Fonts
    nav = _nav_pages(conf["nav"])
    assert len(nav) == len(set(nav)), nav
    excluded = tuple(line.strip() for line in conf.get("exclude_docs", "").splitlines() if line.strip())
    missing = [p for p in nav if not (DOCS / p).is_file()]
    assert not missing, missing
    on_disk = _pages_on_disk(excluded)
    assert on_disk == set(nav), (sorted(on_disk - set(nav)), sorted(set(nav) - on_disk))
    for page in ("index.md", "install.md", "measuring.md", "verdicts.md", "flydsl.md", "models.md",
                 "xray.md", "reports.md", "notebooks.md", "architecture.md", "adding-an-operator.md",
                 "env-ab.md", "data.md", "api.md"):
        assert page in nav, page


def test_strict_link_validation_is_on():
    conf = _config()["validation"]
    assert conf["links"]["not_found"] == conf["links"]["anchors"] == "warn", conf
    assert conf["nav"]["omitted_files"] == conf["nav"]["not_found"] == "warn", conf


def test_the_api_page_names_every_public_name():
    import flyexplore as fx

    text = (DOCS / "api.md").read_text()
    named = set(re.findall(r"^::: flyexplore\.(\w+)$", text, re.M))
    assert re.search(r"^::: flyexplore$", text, re.M)
    assert set(fx.__all__) <= named, sorted(set(fx.__all__) - named)


def test_the_docstring_roles_become_code_spans():
    sys.path.insert(0, str(DOCS / "_griffe"))
    try:
        from fx_docstrings import markdown_roles
    finally:
        sys.path.remove(str(DOCS / "_griffe"))
    assert markdown_roles("see :func:`sweep` and :data:`~flyexplore.measure.stats.BAND`, "
                          ":class:`flyexplore.SweepSpec`") == \
        "see `sweep` and `BAND`, `flyexplore.SweepSpec`"


@pytest.mark.slow
def test_the_site_builds_in_strict_mode(tmp_path):
    site = tmp_path / "site"
    p = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(CONFIG),
                        "--site-dir", str(site)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    for page in ("index.html", "verdicts.html", "api.html", "h200-notebooks/index.html"):
        assert (site / page).is_file(), page
    api = (site / "api.html").read_text()
    assert 'id="flyexplore.sweep"' in api and 'id="flyexplore.measure.stats.BAND"' in api
    assert ":func:`" not in api
    assert "fonts.googleapis.com" not in (site / "index.html").read_text()
