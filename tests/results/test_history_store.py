"""The history store's safety (issue 46's goal "store safety"): adding a file twice changes
nothing, two adds at once from two processes lose and double nothing, a ``kill -9`` at any point
of an add leaves a store that a later add completes, and a damaged result file, a damaged index or
a folder that is no store is refused in one line with the store as it was
(:mod:`flyexplore.results.history_store`)."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT

from flyexplore.errors import UsageError
from flyexplore.results import history_store as HS
from flyexplore.results import table as R
from flyexplore.results.history_store import Store

#: Three real runs of one plan (H200, 24 GEMM rows each, samples and all).
RUNS = [ROOT / f"data/h200/reproducible/run{i}.parquet" for i in (1, 2, 3)]
KEY = ["run_id", "op", "case", "dtype", "backend", "env"]


def _timed_only(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` without samples (its ``time_ms`` then free to change: no samples to recompute it from)."""
    return df.assign(processes=pd.NA, process_estimates=pd.NA, samples_ms=pd.NA)


def _files(path: Path) -> dict[str, str]:
    """Every file under ``path`` (relative name -> digest of its bytes)."""
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def _tables(path: Path) -> dict[str, list]:
    """The index's tables, every row, sorted; ``added_at`` left out (it is when, not what)."""
    con = sqlite3.connect(str(path / HS.INDEX))
    try:
        out = {}
        for t in ("meta", "runs", "parts", "points"):
            cur = con.execute(f"SELECT * FROM {t}")
            cols = [d[0] for d in cur.description]
            out[t] = sorted(tuple(v for c, v in zip(cols, r) if c != "added_at") for r in cur.fetchall())
        return out
    finally:
        con.close()


def _check_whole(path: Path, files: list[Path], orphans: bool = False) -> pd.DataFrame:
    """The store at ``path`` holds exactly the rows of ``files``, once each, with their times; every
    part the index names is on disk and (unless ``orphans``: a killed add's part, which readers
    ignore) it names every part there. Returns the stored rows."""
    st = Store(path)
    want = R.concat([R.load(f) for f in files])
    got = st.rows()
    assert len(got) == len(want)
    assert not got.duplicated(subset=KEY).any()
    w = want.set_index(KEY[:5]).sort_index()
    g = got.set_index(KEY[:5]).sort_index()
    assert g.index.equals(w.index)
    assert (g["time_ms"].astype(float) == w["time_ms"].astype(float)).all()
    assert (g["samples_ms"] == w["samples_ms"]).all()
    pts = st.points()
    assert len(pts) == len(want) and not pts.duplicated(subset=KEY).any()
    tables = _tables(path)
    named = {p[0] for p in tables["parts"]}
    on_disk = {p.name for p in (path / HS.PARTS).glob("*.parquet")}
    assert named <= on_disk if orphans else named == on_disk
    assert sum(p[2] for p in tables["parts"]) == len(want)
    runs = st.runs()
    assert sorted(runs["run_id"]) == sorted(want["run_id"].astype(str).unique())
    assert runs["rows"].sum() == len(want)
    return got


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text and text
    return text


def test_adding_the_same_file_twice_changes_nothing(tmp_path):
    path = tmp_path / "store"
    first = Store(path).add([RUNS[0]])
    assert (first.runs_added, first.rows_added, first.rows_known) == (1, 24, 0)
    tables, parts = _tables(path), _files(path / HS.PARTS)
    again = Store(path).add([RUNS[0], RUNS[0]])
    assert (again.runs_added, again.rows_added, again.rows_known) == (0, 0, 48)
    assert all("already in the store" in line for line in again.lines)
    assert _tables(path) == tables
    assert _files(path / HS.PARTS) == parts and len(parts) == 1
    _check_whole(path, [RUNS[0]])


def test_a_resumed_runs_later_add_brings_only_its_new_rows(tmp_path):
    whole = R.load(RUNS[0])
    partial = R.save(whole.iloc[:10], tmp_path / "partial.parquet")   # the run before its resume
    path = tmp_path / "store"
    Store(path).add([partial])
    parts = _files(path / HS.PARTS)
    later = Store(path).add([RUNS[0]])
    assert (later.runs_added, later.rows_added, later.rows_known) == (0, 14, 10)
    assert "14 rows of 1 run added (0 new runs); 10 rows it had already" in later.lines[0]
    after = _files(path / HS.PARTS)
    assert len(after) == 2 and set(parts.items()) <= set(after.items())   # the first part is never rewritten
    _check_whole(path, [RUNS[0]])


@pytest.mark.parametrize("damage", ["truncated parquet", "csv of other data"])
def test_a_damaged_or_foreign_file_is_refused_in_one_line_and_the_store_is_unchanged(tmp_path, damage):
    path = tmp_path / "store"
    Store(path).add([RUNS[0]])
    before = _files(path)
    if damage == "truncated parquet":
        bad = tmp_path / "cut.parquet"
        data = RUNS[1].read_bytes()
        bad.write_bytes(data[:len(data) // 2])
    else:
        bad = tmp_path / "prices.csv"
        bad.write_text("item,price\napple,1.5\npear,2\n")
    with pytest.raises(UsageError) as exc:
        Store(path).add([RUNS[2], bad])   # a good file beside it is not added either
    assert str(bad) in _one_line(exc)
    assert _files(path) == before
    _check_whole(path, [RUNS[0]])
    fresh = tmp_path / "fresh"
    with pytest.raises(UsageError):
        Store(fresh).add([bad])
    assert not fresh.exists()   # nothing made for a refused add


def test_a_damaged_index_is_refused_in_one_line_and_left_as_it_is(tmp_path):
    path = tmp_path / "store"
    Store(path).add([RUNS[0]])
    idx = path / HS.INDEX
    data = bytearray(idx.read_bytes())
    data[:100] = b"\xa5" * 100   # the SQLite header overwritten
    idx.write_bytes(bytes(data))
    before = _files(path)
    for call in (lambda s: s.add([RUNS[1]]), lambda s: s.points(), lambda s: s.runs(), lambda s: s.rows()):
        with pytest.raises(UsageError) as exc:
            call(Store(path))
        assert "damaged" in _one_line(exc) and str(path) in str(exc.value)
        assert _files(path) == before


def test_a_folder_with_other_files_and_no_index_is_refused_and_untouched(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("not a store\n")
    (folder / "results.parquet").write_bytes(RUNS[0].read_bytes())
    before = _files(folder)
    with pytest.raises(UsageError) as exc:
        Store(folder).add([RUNS[1]])
    assert "not a flyexplore history store" in _one_line(exc)
    for call in (lambda s: s.points(), lambda s: s.runs()):
        with pytest.raises(UsageError) as exc:
            call(Store(folder))
        assert "no history store" in _one_line(exc)
    assert _files(folder) == before
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt", "results.parquet"]


def _index_with(path: Path, what: str) -> None:
    """A ``history.sqlite`` at ``path`` that is no flyexplore store's, or one of a newer layout."""
    if what == "newer layout":
        Store(path).add([RUNS[0]])
    else:
        path.mkdir()
    con = sqlite3.connect(str(path / HS.INDEX))
    if what == "no meta table":
        con.execute("CREATE TABLE notes (text TEXT)")
        con.execute("INSERT INTO notes VALUES ('an app of its own')")
    elif what != "newer layout":
        con.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
        fmt, version = ("other", "1") if what == "format other" else (HS.FORMAT, "x")
        con.execute("INSERT INTO meta VALUES ('format', ?), ('version', ?)", (fmt, version))
    else:
        con.execute("UPDATE meta SET value = ? WHERE key = 'version'", (str(HS.VERSION + 1),))
    con.commit()
    con.close()


@pytest.mark.parametrize("what, said", [
    ("no meta table", "not a flyexplore history index (no meta table"),
    ("format other", "not a flyexplore history index (format 'other'"),
    ("version x", "layout version 'x', not a whole number"),
    ("newer layout", "newer than this flyexplore reads"),
])
def test_a_foreign_or_newer_index_is_refused_in_one_line_before_anything_is_written(tmp_path, what, said):
    path = tmp_path / "store"
    _index_with(path, what)
    before = _files(path)
    for call in (lambda s: s.add([RUNS[1]]), lambda s: s.points(), lambda s: s.runs(), lambda s: s.rows()):
        with pytest.raises(UsageError) as exc:
            call(Store(path))
        assert said in _one_line(exc)
        assert _files(path) == before   # the index's bytes as they were, no lock file, no part
    if what != "newer layout":
        assert sorted(p.name for p in path.iterdir()) == [HS.INDEX]


def test_runs_whose_ids_make_one_file_name_keep_parts_of_their_own(tmp_path):
    base = _timed_only(R.load(RUNS[0]).head(6))
    long = "x" * 90
    ids = ["r/1", "r_1", long + "a", long + "b"]   # '/' made '_'; names cut at 80 characters
    frames = {rid: base.assign(run_id=rid, time_ms=base["time_ms"] * (1 + i)) for i, rid in enumerate(ids)}
    path = tmp_path / "store"
    Store(path).add([frames["r/1"], frames[long + "a"]])
    later = Store(path).add([frames["r_1"], frames[long + "b"]])
    assert (later.runs_added, later.rows_added) == (2, 12)
    got = Store(path).rows()
    assert len(got) == 24
    for rid, df in frames.items():
        mine = got[got["run_id"] == rid].set_index(KEY[1:5]).sort_index()
        assert (mine["time_ms"].to_numpy() == df.set_index(KEY[1:5]).sort_index()["time_ms"].to_numpy()).all()
    named = {p[0] for p in _tables(path)["parts"]}
    assert len(named) == 4 and named == {p.name for p in (path / HS.PARTS).glob("*.parquet")}


@pytest.mark.parametrize("column, value, said", [
    ("device_id", "GPU-another-one", "device GPU-another-one, the store's GPU-7f6f2386"),
    ("env_id", "0123456789ab", "env_id 0123456789ab, the store's 9571ed3da63d"),
    ("plan", "another-plan", "plan another-plan, the store's fe72f1367bcc"),
])
def test_a_stored_run_from_another_device_build_or_plan_is_refused_whole(tmp_path, column, value, said):
    path = tmp_path / "store"
    Store(path).add([RUNS[0]])
    before = _files(path)
    run = R.load(RUNS[0])
    other = R.save(run.head(10).assign(**{column: value}), tmp_path / "other.parquet")
    with pytest.raises(UsageError) as exc:
        Store(path).add([RUNS[1], other])   # the good file beside it is not added either
    line = _one_line(exc)
    assert str(other) in line and f"run {run['run_id'].iloc[0]} " in line and said in line
    assert str(path) in line and "nothing added" in line
    assert _files(path) == before
    fresh = tmp_path / "fresh"   # the same within one add: refused before a store is made
    with pytest.raises(UsageError) as exc:
        Store(fresh).add([RUNS[0], other])
    assert said in _one_line(exc) and f"{RUNS[0]}, added before it" in str(exc.value)
    assert not fresh.exists()


def test_known_rows_with_other_times_are_kept_as_stored_and_said(tmp_path):
    run = _timed_only(R.load(RUNS[0]))
    first = R.save(run.head(10), tmp_path / "first.parquet")
    changed = run.copy()
    changed.loc[:2, "time_ms"] = changed.loc[:2, "time_ms"] * 1.5
    second = R.save(changed, tmp_path / "second.parquet")
    path = tmp_path / "store"
    Store(path).add([first])
    a = Store(path).add([second])
    assert (a.rows_added, a.rows_known, a.rows_other) == (14, 10, 3)
    assert a.lines[0].endswith("; 10 rows it had already, 3 of them with other values, kept as stored")
    again = Store(path).add([second])
    assert again.lines[0] == (f"{second}: already in the store (24 rows of 1 run, 3 of them with other values, "
                              "kept as stored)")
    _check_whole(path, [R.save(run, tmp_path / "stored.parquet")])   # the first file's times, as stored


def test_every_run_has_a_timestamp_and_sql_and_pandas_order_runs_alike(tmp_path):
    base = R.load(RUNS[0]).head(4)
    old = base.assign(run_id="z-old", timestamp=["2020-01-01T00:00:03+00:00", "2020-01-01T00:00:01+00:00",
                                                 "2020-01-01T00:00:02+00:00", None])
    untimed = base.assign(run_id="a-untimed", timestamp=None)
    path = tmp_path / "store"
    Store(path).add([untimed, old])
    runs = Store(path).runs()
    assert runs["timestamp"].notna().all()
    by_id = runs.set_index("run_id")
    assert by_id.at["z-old", "timestamp"] == "2020-01-01T00:00:01+00:00"   # its rows' earliest
    assert by_id.at["a-untimed", "timestamp"] == by_id.at["a-untimed", "added_at"]   # the add's time
    assert runs["run_id"].tolist() == ["z-old", "a-untimed"]
    assert runs.sort_values(["timestamp", "run_id"])["run_id"].tolist() == runs["run_id"].tolist()
    pts = Store(path).points()
    assert list(dict.fromkeys(pts["run_id"])) == runs["run_id"].tolist()


def test_a_stores_own_names_are_no_other_files_but_others_are_refused_under_the_lock(tmp_path, monkeypatch):
    path = tmp_path / "store"   # what another add, making this store now, may have left there so far
    (path / HS.PARTS).mkdir(parents=True)
    for name in (HS.LOCK, HS.INDEX + "-journal", f".{HS.INDEX}.abc123.tmp"):
        (path / name).write_bytes(b"")
    Store(path).add([RUNS[0]])
    _check_whole(path, [RUNS[0]])
    import filelock

    class Late(filelock.FileLock):   # another program writes into the folder while the add waits
        def acquire(self, *a, **k):
            (Path(self.lock_file).parent / "notes.txt").write_text("mine\n")
            return super().acquire(*a, **k)

    monkeypatch.setattr(filelock, "FileLock", Late)
    fresh = tmp_path / "fresh"
    with pytest.raises(UsageError) as exc:
        Store(fresh).add([RUNS[0]])
    assert "not a flyexplore history store" in _one_line(exc) and "'notes.txt'" in str(exc.value)
    assert sorted(p.name for p in fresh.iterdir()) == [HS.LOCK, "notes.txt"]   # no index, no part


def test_the_index_has_sql_indexes_on_device_build_commit_plan_and_device_key(tmp_path):
    path = tmp_path / "store"
    Store(path).add([RUNS[0]])
    con = sqlite3.connect(str(path / HS.INDEX))
    try:
        have = {(t, con.execute(f"PRAGMA index_info({i!r})").fetchone()[2])
                for t in ("runs", "points") for _, i, *_ in con.execute(f"PRAGMA index_list({t})")}
        plan = " ".join(str(r) for r in con.execute("EXPLAIN QUERY PLAN SELECT run_id FROM runs WHERE plan = 'p'"))
    finally:
        con.close()
    assert {("runs", "device"), ("runs", "env_id"), ("runs", "flyexplore_commit"), ("runs", "plan"),
            ("points", "device_key")} <= have
    assert "USING INDEX runs_plan" in plan


def test_a_failed_adds_part_is_ignored_and_written_again_only_for_the_same_keys(tmp_path, monkeypatch):
    run = R.load(RUNS[0])
    partial = R.save(run.head(10), tmp_path / "partial.parquet")
    path = tmp_path / "store"
    real_save = R.save

    def save_then_die(df, p):   # the add stops after its part is written, before the index names it
        real_save(df, p)
        raise KeyboardInterrupt

    monkeypatch.setattr(R, "save", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        Store(path).add([partial])
    monkeypatch.setattr(R, "save", real_save)
    (orphan,) = (path / HS.PARTS).glob("*.parquet")
    assert Store(path).points().empty and Store(path).rows().empty   # readers ignore it
    Store(path).add([partial])   # the same run and keys: the same name, written again
    assert [p.name for p in (path / HS.PARTS).glob("*.parquet")] == [orphan.name]
    _check_whole(path, [partial])
    monkeypatch.setattr(R, "save", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        Store(path).add([RUNS[0]])   # killed with the other 14 rows' part on disk
    monkeypatch.setattr(R, "save", real_save)
    stray = {p.name for p in (path / HS.PARTS).glob("*.parquet")} - {orphan.name}
    Store(path).add([run.iloc[10:].assign(run_id=run["run_id"].iloc[0]).iloc[:7]])   # other keys
    kept = {p.name for p in (path / HS.PARTS).glob("*.parquet")}
    assert stray <= kept and not stray & {p[0] for p in _tables(path)["parts"]}   # an orphan the index never names
    assert len(Store(path).rows()) == 17


# -- other processes ----------------------------------------------------------------------------

#: A child that adds files to a store, with a pause at one point of the add: ``part`` (after
#: the Nth part is written, before the index names it) or ``transaction`` (inside the Nth index
#: transaction, its rows written, before the commit); it writes MARKER there and sleeps, to be
#: killed. ``sleep``: it waits for the file MARKER.go, then sleeps 0.5 s after every part.
CHILD = r"""
import json, sys, time
from pathlib import Path
from flyexplore.results import history_store as HS
from flyexplore.results import table as R

where, nth, marker, store, *files = sys.argv[1:]
nth, marker, calls = int(nth), Path(marker), [0]

def pause(what):
    calls[0] += 1
    if where == "sleep":
        time.sleep(0.5)
    elif calls[0] == nth:
        marker.write_text(what)
        time.sleep(600)

if where in ("part", "sleep"):
    real_save = R.save
    def save(df, path):
        out = real_save(df, path)
        pause(str(path))
        return out
    R.save = save
elif where == "transaction":
    real_connect = HS.Store._connect
    class Con:
        def __init__(self, con): self.con = con
        def __getattr__(self, name): return getattr(self.con, name)
        def __enter__(self): return self.con.__enter__()
        def __exit__(self, *a): return self.con.__exit__(*a)
        def executemany(self, *a):
            out = self.con.executemany(*a)
            pause("transaction")
            return out
    HS.Store._connect = lambda self, create=False: Con(real_connect(self, create))
go = Path(str(marker) + ".go")
while where == "sleep" and not go.exists():
    time.sleep(0.01)
a = HS.Store(store).add(files)
print(json.dumps({"runs_added": a.runs_added, "rows_added": a.rows_added, "rows_known": a.rows_known}))
"""


def _child(where: str, nth: int, marker: Path, store: Path, files: list[Path]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-c", CHILD, where, str(nth), str(marker), str(store), *map(str, files)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(marker: Path, proc: subprocess.Popen, timeout: float = 300.0) -> None:
    end = time.monotonic() + timeout
    while not marker.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the child ended before its pause: {proc.communicate()}")
        assert time.monotonic() < end, "the child never reached its pause"
        time.sleep(0.02)


@pytest.mark.slow
def test_two_adds_at_once_from_two_processes_lose_and_double_nothing(tmp_path):
    path = tmp_path / "store"
    # each child waits for the same go file, and pauses 0.5 s after each part it writes: the two
    # adds overlap, and run 2 is in both
    a = _child("sleep", 1, tmp_path / "a", path, [RUNS[0], RUNS[1]])
    b = _child("sleep", 1, tmp_path / "b", path, [RUNS[1], RUNS[2]])
    (tmp_path / "a.go").touch()
    (tmp_path / "b.go").touch()
    outs = []
    for p in (a, b):
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(o["rows_added"] for o in outs) == 72
    assert sum(o["rows_known"] for o in outs) == 24   # run 2, added by whichever came first
    assert sum(o["runs_added"] for o in outs) == 3
    _check_whole(path, RUNS)


@pytest.mark.slow
@pytest.mark.parametrize("where, nth, files, committed", [
    ("part", 1, [0], 0),          # the part written, the index not yet naming it
    ("transaction", 1, [0], 0),   # the index's rows written, not committed
    ("part", 2, [0, 1], 24),      # the first run's add committed, the second's part written
])
def test_a_kill_9_during_an_add_loses_and_doubles_nothing(tmp_path, monkeypatch, where, nth, files, committed):
    monkeypatch.setattr(HS, "LOCK_TIMEOUT_S", 60.0)   # a lock the killed add kept would fail, not hang
    path = tmp_path / "store"
    srcs = [RUNS[i] for i in files]
    marker = tmp_path / "paused"
    proc = _child(where, nth, marker, path, srcs)
    try:
        _wait_for(marker, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    if where == "part":   # killed with a part on disk that the index does not name
        part = Path(marker.read_text())
        assert part.is_file() and part.name not in {p[0] for p in _tables(path)["parts"]}
    else:                 # killed inside the transaction: SQLite's rollback journal is there
        assert (path / (HS.INDEX + "-journal")).is_file()
    pts = Store(path).points()
    assert len(pts) == committed and not pts.duplicated(subset=KEY).any()
    if committed:
        _check_whole(path, srcs[:1], orphans=True)
    later = Store(path).add(srcs)
    assert (later.rows_added, later.rows_known) == (24 * len(srcs) - committed, committed)
    _check_whole(path, srcs)
    assert not list((path / HS.PARTS).glob("*.tmp*"))
