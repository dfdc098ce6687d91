"""A full disk for the output tests (issue 33): each writer runs in a child process while the
folder it writes to is really full, and the child reports what the writer left there.

Two ways to fill a disk, the first that works on this machine (:func:`mode`):

- ``tmpfs``: a user and mount namespace (``unshare --user --map-root-user --mount``, no root
  needed where the kernel allows it) with a small tmpfs mounted on the folder; before a writer
  runs, a filler file beside the case folders takes every free page, so a write fails with
  ENOSPC (``No space left on device``) as on a full disk;
- ``rlimit``: ``RLIMIT_FSIZE`` lowered in the child (``SIGXFSZ`` ignored), so a write past the
  limit fails with EFBIG (``File too large``) midway, as a full disk fails it
  (``FULL_DISK_MODE=rlimit`` chooses it where the tmpfs would work).

Each case (:data:`CASES`) prepares its folder (an old file, an earlier report, or nothing), the
disk is filled, the writer runs (a ``flyexplore`` command in-process, or a library call), the
disk is freed, and the child reports the exit code, stderr and every file of the folder with
its SHA-256 before and after. ``room``: bytes a writer may still write (an append then tears
midway). The child is this file, run by path: ``python full_disk.py MODE ROOT CASE...``; JSON on
stdout.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import io
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data/h200/demo/results.parquet"
SWEEP = ROOT / "data/h200/model_coverage/llama-3.1-8b_gemm.parquet"
#: A Llama-style model small enough to capture in a few seconds (``flyexplore model``).
TINY_LLAMA = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 1,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024,
              "max_position_embeddings": 8192}
#: Size of the tmpfs: an earlier report (plotly.js, 4.8 MB) and the rest fit before it is filled.
TMPFS_MB = 32
#: The OS's words for a full disk in each mode.
REASON = {"tmpfs": "[Errno 28] No space left on device", "rlimit": "[Errno 27] File too large"}
OLD = b"the old file, which a failed write must leave as it is\n"
FILLER = ".filler"


# ------------------------------------------------------------------------------- the parent side

@functools.lru_cache(maxsize=1)
def mode() -> str:
    """``tmpfs`` where a user+mount namespace can mount one here, else ``rlimit``
    (``FULL_DISK_MODE=rlimit`` chooses it)."""
    if os.environ.get("FULL_DISK_MODE") in ("tmpfs", "rlimit"):
        return os.environ["FULL_DISK_MODE"]
    unshare = shutil.which("unshare")
    if unshare and sys.platform == "linux":
        probe = subprocess.run([unshare, "--user", "--map-root-user", "--mount", "sh", "-c",
                                "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs \"$d\" && umount \"$d\"; "
                                "s=$?; rmdir \"$d\"; exit $s"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return "tmpfs"
    return "rlimit"


def run_cases(folder: Path, names: list[str], timeout: float = 600) -> dict[str, dict]:
    """Run the :data:`CASES` ``names`` (``kind:variant``) in one child with ``folder`` full;
    returns ``{name: report}`` (see :func:`_run_one`) and, under ``"_mode"``, the mode."""
    folder.mkdir(parents=True, exist_ok=True)
    m = mode()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    child = [sys.executable, str(Path(__file__).resolve()), m, str(folder), *names]
    if m == "tmpfs":
        child = [shutil.which("unshare"), "--user", "--map-root-user", "--mount", "sh", "-c",
                 f'mount -t tmpfs -o size={TMPFS_MB}m tmpfs "$1" && shift && exec "$@"', "sh", str(folder), *child]
    p = subprocess.run(child, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    assert p.returncode == 0, f"the full-disk child failed ({m}):\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    got = json.loads(p.stdout.strip().splitlines()[-1])
    got["_mode"] = m
    return got


# -------------------------------------------------------------------------------- the child side

def _cli(*argv) -> tuple[int, str]:
    """``flyexplore ARGV`` in this process: (exit code, stderr)."""
    from flyexplore.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main([str(a) for a in argv])
    return rc, err.getvalue()


def _call(fn) -> tuple[int, str]:
    """A library call: (0, '') or (2, '<exception type>: <message>')."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which asserts on it
        return 2, f"{type(exc).__name__}: {exc}"
    return 0, ""


def _results(n: int | None = None):
    from flyexplore.results import table as R

    df = R.load(DEMO)
    return df if n is None else df.head(n)


def _save(name: str):
    from flyexplore.results import table as R

    return lambda d: _call(lambda: R.save(_results(), d / name))


def _table_md(d: Path):
    from flyexplore.views.export import save_table

    return _call(lambda: save_table(_results(), d / "t.md"))


def _ok(got: tuple[int, str]) -> None:
    """An old output made by a writer before the disk is full: it must have worked."""
    assert got[0] == 0, got


def _old_file(name: str, data: bytes = OLD):
    def make(d: Path) -> None:
        (d / name).write_bytes(data)
    return make


def _warm_kaleido(d: Path) -> None:
    """Start the browser before the disk is full, and wait until it has rendered an image (it
    starts in a thread and writes its page into a temporary folder; under ``rlimit`` that
    write would fail, and kaleido's server then never answers)."""
    import tempfile

    import plotly.graph_objects as go

    from flyexplore.views.export import save_figures

    # one retry: on a loaded machine kaleido has once been asked to render before its own page had
    # loaded ("ReferenceError: kaleido_scopes is not defined", 1 of 4 CI runs with -n 3); the
    # warm-up only starts the browser, the exports under test come after it and are not retried
    for attempt in (1, 2):
        try:
            with tempfile.TemporaryDirectory() as t:
                save_figures({"warm": go.Figure(go.Bar(x=[1], y=[1]))}, t, ["png"])
            return
        except RuntimeError as exc:
            if attempt == 2 or "kaleido_scopes is not defined" not in str(exc):
                raise


def _model_config(d: Path) -> None:
    (d / "llama.json").write_text(json.dumps(TINY_LLAMA))


def _model_md(d: Path):
    return _cli("model", "--config", d / "llama.json", "--phase", "prefill", "--batch", "1", "--seq", "16",
                "--view", "eager", "--md", d / "m.md")


#: An old step summary that nearly fills its last 4 KiB page: an append of a summary table
#: (about 900 bytes) then gets 100 bytes in (:data:`SUMMARY_ROOM`) before the disk is full.
OLD_SUMMARY = ("## an earlier step\n\n" + "| a | b |\n|---|---|\n" + "| 1 | 2 |\n" * 500).encode()[:3996]
SUMMARY_ROOM = 100

#: kind -> target (relative to the case folder), make-old (None: no old variant), the writer,
#: what to do before the disk is filled (imports, a browser, inputs), room left for the writer.
CASES = {
    "report": dict(target="rep", old=lambda d: _ok(_cli("report", DEMO, "--out", d / "rep", "--no-images")),
                   act=lambda d: _cli("report", DEMO, "--out", d / "rep", "--no-images")),
    "export-html": dict(target="f.html", old=_old_file("f.html"),
                        act=lambda d: _cli("export", DEMO, "--op", "gemm", "--out", d / "f.html")),
    "export-png": dict(target="f.png", old=_old_file("f.png"), warm=_warm_kaleido,
                       act=lambda d: _cli("export", DEMO, "--op", "gemm", "--out", d / "f.png")),
    "parquet": dict(target="r.parquet", old=_old_file("r.parquet"), act=_save("r.parquet")),
    "csv": dict(target="r.csv", old=_old_file("r.csv"), act=_save("r.csv")),
    "jsonl": dict(target="r.jsonl", old=_old_file("r.jsonl"), act=_save("r.jsonl")),
    "table-md": dict(target="t.md", old=_old_file("t.md"), act=_table_md),
    "compare-json": dict(target="c.json", old=_old_file("c.json"),
                         act=lambda d: _cli("compare", SWEEP, SWEEP, "--json", d / "c.json")),
    "compare-summary-md": dict(target="s.md", old=_old_file("s.md", OLD_SUMMARY), room=SUMMARY_ROOM,
                               act=lambda d: _cli("compare", SWEEP, SWEEP, "--summary-md", d / "s.md")),
    "model-md": dict(target="m.md", old=_old_file("m.md"), warm=_model_config, act=_model_md),
    "sweep-journal": dict(target="r.parquet.journal.sqlite", old=None,
                          act=lambda d: _cli("sweep", "--op", "gemm", "--shapes", "8x8x8", "--backends", "aten",
                                             "--out", d / "r.parquet", "--resume")),
}


def _snapshot(folder: Path) -> dict[str, str]:
    """Every entry under ``folder`` (hidden ones too): a file's SHA-256, ``dir`` for a folder."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        out[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@contextlib.contextmanager
def _full(root: Path, m: str, room: int, limit_base: int):
    """The disk of ``root`` full (but ``room`` bytes) while the block runs."""
    if m == "tmpfs":
        filler = root / FILLER
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        chunk = b"\0" * (1 << 20)
        try:
            while True:
                os.write(fd, chunk)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        if room:
            os.ftruncate(fd, os.fstat(fd).st_size - room)
        os.close(fd)
        try:
            yield
        finally:
            filler.unlink()
    else:
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_base + room, hard))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def _run_one(root: Path, m: str, name: str) -> dict:
    """Run one case; returns rc, err, whether the target was there before, the snapshots."""
    kind, variant = name.split(":")
    case = CASES[kind]
    d = root / name.replace(":", "-")
    d.mkdir()
    if case.get("warm"):
        case["warm"](d)
    if variant == "old":
        case["old"](d)
    target = d / case["target"]
    before = _snapshot(d)
    size = target.stat().st_size if target.is_file() else 0
    with _full(root, m, case.get("room", 0), size):
        rc, err = case["act"](d)
    return {"rc": rc, "err": err, "target": str(target), "existed": bool(size) or target.is_dir(),
            "before": before, "after": _snapshot(d)}


def main(argv: list[str]) -> int:
    m, root, names = argv[0], Path(argv[1]), argv[2:]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past RLIMIT_FSIZE fails (EFBIG), no kill
    got = {name: _run_one(root, m, name) for name in names}
    print(json.dumps(got))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv[1:]))
