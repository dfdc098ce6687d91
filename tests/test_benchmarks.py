"""The benchmarks and the data they made, findable (issue 36): every script under ``benchmarks/``
is in ``benchmarks/README.md`` (and every script listed there exists), no file names a
``benchmarks/`` path that is not there (so an old path cannot linger after a move), and every
folder under ``data/`` is in ``data/README.md``'s index."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

from conftest import ROOT

BENCH = ROOT / "benchmarks"
#: A path into benchmarks/ as text names it (not ``vllm/benchmarks/serve.py``: nothing before it).
BENCH_PATH = re.compile(r"(?<![\w/.-])benchmarks/[\w./-]*")


def _scripts() -> set[str]:
    return {str(p.relative_to(BENCH)) for p in BENCH.rglob("*")
            if p.is_file() and p.suffix in (".py", ".sh") and "__pycache__" not in p.parts}


def test_every_script_is_listed_in_the_readme_and_every_listed_one_exists():
    text = (BENCH / "README.md").read_text()
    listed = set(re.findall(r"`((?:evidence|gpu|tools)/[\w.-]+\.(?:py|sh))`", text))
    scripts = _scripts()
    assert scripts, "no scripts found under benchmarks/"
    assert scripts - listed == set(), f"scripts missing from benchmarks/README.md: {sorted(scripts - listed)}"
    assert listed - scripts == set(), f"benchmarks/README.md lists scripts that are not there: {sorted(listed - scripts)}"
    for folder in ("evidence", "gpu", "tools"):   # one section per folder, each script in its own
        section = text.split(f"## `{folder}/`", 1)[1].split("\n## ", 1)[0]
        assert {s for s in listed if s.startswith(folder + "/")} == set(
            re.findall(r"^\| `((?:evidence|gpu|tools)/[\w.-]+)`", section, re.M)), folder


def _text_files() -> list[Path]:
    """The repository's .py, .md, .ipynb and .sh files (tracked, or new and not ignored) outside
    data/ (whose outputs keep the commands that made them, old paths included)."""
    try:
        names = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard"],
                               capture_output=True, text=True, check=True, timeout=60).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        names = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                 if p.is_file() and not {".git", ".venv", "node_modules"} & set(p.relative_to(ROOT).parts)]
    keep = []
    for n in names:
        # data/ and docs/h200-notebooks/ are recorded runs: they keep the commands that ran
        if not n.endswith((".py", ".md", ".ipynb", ".sh")) or n.startswith(("data/", "docs/h200-notebooks/")):
            continue
        if (ROOT / n).is_file():
            keep.append(ROOT / n)
    return keep


def test_every_benchmarks_path_named_in_the_repository_exists():
    files = _text_files()
    assert any(f.name == "test_benchmarks.py" for f in files) and len(files) > 50
    missing = []
    for f in files:
        for m in BENCH_PATH.finditer(f.read_text(encoding="utf-8", errors="replace")):
            path = m.group(0).rstrip(".,")
            if not (ROOT / path).exists():
                missing.append(f"{f.relative_to(ROOT)}: {path}")
    assert missing == [], "paths into benchmarks/ that are not there:\n" + "\n".join(sorted(set(missing)))


def test_the_path_check_catches_an_old_path():
    old = "benchmarks" + "/torture.py"   # (spelled in two halves: this file is checked too)
    text = f"see `{old}` and vllm/benchmarks/serve.py, and benchmarks/evidence/torture.py."
    got = [m.group(0).rstrip(".,") for m in BENCH_PATH.finditer(text)]
    assert got == [old, "benchmarks/evidence/torture.py"]
    assert not (ROOT / got[0]).exists() and (ROOT / got[1]).exists()


def _index_folders() -> set[str]:
    """The folders named in the first column of data/README.md's index table."""
    text = (ROOT / "data" / "README.md").read_text()
    return {m.strip("/") for m in re.findall(r"^\| `([\w./-]+)`", text, re.M)}


def test_every_data_folder_is_in_the_index():
    data = ROOT / "data"
    folders = {str(p.relative_to(data)) for p in data.glob("*") if p.is_dir()}
    folders |= {str(p.relative_to(data)) for p in data.glob("*/*") if p.is_dir()}
    folders = {f for f in folders if "__pycache__" not in f}
    assert {"h200/ab", "bench", "published"} <= folders
    indexed = _index_folders()
    assert folders - indexed == set(), f"data/ folders missing from data/README.md's index: {sorted(folders - indexed)}"
    assert indexed - folders == set(), f"data/README.md indexes folders that are not there: {sorted(indexed - folders)}"
