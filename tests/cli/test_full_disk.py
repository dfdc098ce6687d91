"""A full disk while each kind of output is written (issue 33, defect 2): a report, a figure
(HTML and PNG), result files (Parquet, CSV, JSON Lines), a Markdown table, ``compare --json``,
``compare --summary-md`` (an append) and ``model --md``. For each, over an old file and where
there was none: exit code 2 (a library call: :class:`~flyexplore.errors.WriteError`), one line
naming the file, the OS's reason and what was left, and the folder byte for byte as it was (the
old file unchanged, no temporary file, no new file or folder). The disk is really full: a tmpfs
in a user namespace where the machine allows one, else ``RLIMIT_FSIZE`` (``tests/full_disk.py``).
All cases run in one child process."""
import pytest
from full_disk import CASES, REASON, run_cases

from flyexplore.views.export import static_export_problem

KINDS = [k for k in CASES if k != "sweep-journal"]   # the journal's case: tests/run/test_journal.py
NAMES = [f"{k}:{v}" for k in KINDS for v in ("old", "new")]
LIBRARY = ("parquet", "csv", "jsonl", "table-md")    # library calls; the rest are commands


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    names = [n for n in NAMES if not (n.startswith("export-png") and static_export_problem())]
    return run_cases(tmp_path_factory.mktemp("full"), names)


def _left(kind: str, variant: str) -> str:
    if kind == "report":
        return "the earlier report is unchanged" if variant == "old" else "no report was written"
    return "the old file is unchanged" if variant == "old" else "nothing was written"


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_a_full_disk_leaves_the_output_as_it_was(full, name):
    if name not in full:
        pytest.skip(f"no static figure export here: {static_export_problem()}")
    r, mode = full[name], full["_mode"]
    kind, variant = name.split(":")
    assert r["existed"] == (variant == "old"), r
    lines = r["err"].splitlines()
    assert r["rc"] == 2 and len(lines) == 1 and "Traceback" not in r["err"], r["err"]
    head = "WriteError: " if kind in LIBRARY else "flyexplore: error: "
    where = r["target"] + ("/" if kind == "report" else "")   # a report names the file in its folder
    assert lines[0].startswith(f"{head}cannot write {where}"), lines[0]
    assert f": {REASON[mode]} ({_left(kind, variant)})" in lines[0], lines[0]
    assert r["after"] == r["before"], (mode, r["before"], r["after"])
