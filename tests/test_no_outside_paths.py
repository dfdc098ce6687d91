"""No tracked file names a path outside the repository: users have the repository only, so a
fact's source is named as its public source (a blog post, a datasheet, a file at a tag), never as a
folder of the machine it was written on."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

from conftest import ROOT

#: A path outside the repository: the background folders beside a checkout (shared/, the tool
#: library .library/, the mission text), or an absolute /work/ path (not a folder that merely ends
#: in "work", such as /root/out/work/ on the GPU machine).
OUTSIDE = re.compile(r"\.\./shared|shared/(?:reference|mission|measurements)|\.library/|mission/000_"
                     r"|(?<![\w.~-])/work/")
#: Binary formats that are tracked (images, tables, archives): never read as text.
BINARY = (".png", ".jpg", ".jpeg", ".gif", ".pdf", ".parquet", ".sqlite", ".gz", ".zip", ".whl", ".ico")
#: Lines of recorded run output that name the checkout the run used on its machine, kept as the
#: run printed them: (file, text on the line). Each must still be there (so the list cannot go
#: stale); any other match fails.
RECORDED = {
    ("data/h200/reproducible/old_rule_shift/run2.log", "(/work/main/flyexplore/ops/gemm/operator.py:"),
}


#: This file spells the patterns out, so it is the one file not searched.
SELF = "tests/test_no_outside_paths.py"


def _tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    files = []
    for name in out.stdout.split("\0"):
        path = Path(ROOT) / name
        if name and name != SELF and not name.lower().endswith(BINARY) and path.is_file():
            head = path.read_bytes()[:8192]
            if b"\0" not in head:
                files.append(path)
    return files


def outside_paths(path: Path, root: Path) -> list[str]:
    """``file:line: text`` for each line of ``path`` that names a path outside the repository."""
    rel = path.relative_to(root).as_posix()
    hits = []
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if OUTSIDE.search(line) and not any(rel == f and text in line for f, text in RECORDED):
            hits.append(f"{rel}:{n}: {line.strip()[:160]}")
    return hits


def test_no_tracked_file_names_a_path_outside_the_repository():
    files = _tracked_text_files()
    assert len(files) > 100, len(files)
    hits = [h for f in files for h in outside_paths(f, Path(ROOT))]
    assert not hits, "\n".join(hits)


def test_the_recorded_exceptions_are_still_there():
    for name, text in RECORDED:
        assert text in (Path(ROOT) / name).read_text(), (name, text)


def test_the_check_names_file_and_line(tmp_path):
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text("fine\nsee ../shared/reference/x.md\nok: /root/out/work/a.parquet\n"
                    "bad: /work/main/x\nshared/mission/y.txt\n")
    assert [h.split(": ", 1)[0] for h in outside_paths(page, tmp_path)] == \
        ["docs/page.md:2", "docs/page.md:4", "docs/page.md:5"]
