"""The sweep's SQLite journal (flyexplore.run.journal): rows that survive kills, a full disk and a
second sweep on the same file, and that are never written twice (issue 22)."""
import json
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest
from full_disk import run_cases

from flyexplore.cli import main
from flyexplore.errors import UsageError
from flyexplore.results import table as R
from flyexplore.run.journal import (
    Journal,
    committed_rows,
    journal_path,
    legacy_journal_path,
    lock_path,
)
from flyexplore.run.spec import SweepSpec
from flyexplore.run.sweep import NOTES_ATTR, run_sweep
from tests.run.test_sweep import FAST, toy_op

HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))
SHAPES = "4x4;8x8;16x16"

# a sweep of the toy operator in its own process; {patch} runs first (a fault to inject)
SCRIPT = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r}); sys.path.insert(0, {here!r}); sys.path.insert(0, {root!r})
    from test_sweep import toy_op, FAST
    from flyexplore.run.spec import SweepSpec
    from flyexplore.run.sweep import run_sweep
    {patch}
    run_sweep(SweepSpec(toy_op(wait_on={wait_on!r}, wait_for={wait_for!r}), shapes={shapes!r}, backends="good",
                        out={out!r}, resume={resume}, timer=FAST), progress=False)
""")


def _script(out, *, patch="", wait_on=(), wait_for=None, resume=False, shapes=SHAPES):
    return SCRIPT.format(tests=os.path.dirname(HERE), here=HERE, root=ROOT, patch=patch, wait_on=set(wait_on),
                         wait_for=str(wait_for), out=str(out), resume=resume, shapes=shapes)


def _wait_rows(out, n, proc, limit=300):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if journal_path(out).exists() and len(committed_rows(out)) >= n:
            return
        assert proc.poll() is None, "the sweep ended early"
        time.sleep(0.1)
    raise AssertionError(f"no {n} journaled rows in {limit} s")


def _resume(out, shapes=SHAPES, **kw):
    return run_sweep(SweepSpec(toy_op(), shapes=shapes, backends="good", out=out, resume=True, timer=FAST, **kw),
                     progress=False)


@pytest.mark.slow
def test_a_second_sweep_on_the_same_out_is_refused_naming_the_first(tmp_path):
    out, go = tmp_path / "r.parquet", tmp_path / "go"
    first = subprocess.Popen([sys.executable, "-c", _script(out, wait_on={"16x16"}, wait_for=go)])
    try:
        _wait_rows(out, 2, first)
        for resume in (False, True):
            with pytest.raises(UsageError) as ei:
                run_sweep(SweepSpec(toy_op(), shapes=SHAPES, backends="good", out=out, timer=FAST,
                                    resume=resume, overwrite=not resume), progress=False)
            assert f"being written by another sweep (pid {first.pid} on " in str(ei.value)
        go.touch()
        assert first.wait(300) == 0
    finally:
        first.kill()
    assert R.load(out)["case"].tolist() == ["4x4", "8x8", "16x16"]
    assert not journal_path(out).exists()


@pytest.mark.slow
def test_the_lock_of_a_killed_sweep_is_taken_over_and_resume_completes(tmp_path):
    out, go = tmp_path / "r.csv", tmp_path / "go"
    first = subprocess.Popen([sys.executable, "-c", _script(out, wait_on={"16x16"}, wait_for=go)])
    _wait_rows(out, 2, first)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert lock_path(out).exists() and not out.exists()
    df = _resume(out)
    assert df["case"].tolist() == ["4x4", "8x8", "16x16"] and not df.duplicated(list(R.KEY)).any()
    R.validate(R.load(out))


@pytest.mark.slow
def test_a_kill_between_the_final_write_and_the_journal_delete_doubles_nothing(tmp_path):
    out = tmp_path / "r.parquet"
    patch = ("import flyexplore.results.table as T\n"
             "real = T.save\n"
             "def save(df, path):\n"
             "    real(df, path)\n"
             "    os.kill(os.getpid(), signal.SIGKILL)\n"
             "T.save = save\n")
    p = subprocess.run([sys.executable, "-c", _script(out, patch=patch)], capture_output=True, timeout=600)
    assert p.returncode == -signal.SIGKILL
    assert len(R.load(out)) == 3 and len(committed_rows(out)) == 3  # both there: the dangerous moment
    ran = []
    df = run_sweep(SweepSpec(toy_op(), shapes=SHAPES, backends="good", out=out, resume=True, timer=FAST),
                   progress=False, on_row=ran.append)
    assert ran == [] and len(df) == 3 and len(R.load(out)) == 3 and not journal_path(out).exists()


def test_a_row_is_never_written_twice_and_retry_replaces_a_crashed_one(tmp_path):
    out = tmp_path / "r.jsonl"
    keys = [("4x4", "fp32", "good")]
    j = Journal.open(out, resume=False, overwrite=False, extend=False, retry_failed=False,
                     plan_fingerprint="p1", plan={"op": "toy"}, op="toy", keys=keys)
    try:
        row = {"op": "toy", "case": "4x4", "dtype": "fp32", "backend": "good", "run_id": "r1",
               "status": "crashed", "message": "worker crashed"}
        assert j.add(row) is True
        assert j.add(row) is False                      # the same run again
        assert j.add({**row, "run_id": "r2"}) is False  # another run of the same plan
        assert j.count() == 1 and j.done() == {("toy", "4x4", "fp32", "good")}
        with pytest.raises(sqlite3.IntegrityError):     # the database itself refuses it
            j.con.execute('INSERT INTO rows (op, "case", dtype, backend, run_id, plan, row) '
                          "VALUES ('toy', '4x4', 'fp32', 'good', 'r3', 'p1', '{}')")
        j.finish(j.frame())
    finally:
        j.close()
    j = Journal.open(out, resume=True, overwrite=False, extend=False, retry_failed=True,
                     plan_fingerprint="p1", plan={"op": "toy"}, op="toy", keys=keys)
    try:
        assert j.done() == set()  # the crashed row runs again
        assert j.add({**row, "run_id": "r4", "status": "ok", "time_ms": 1.0}) is True
        df = j.frame()
        assert df["status"].tolist() == ["ok"] and df["run_id"].tolist() == ["r4"]
    finally:
        j.close()


def test_resume_with_another_plan_is_refused_naming_what_differs_unless_extend(tmp_path):
    out = tmp_path / "r.parquet"
    run_sweep(SweepSpec(toy_op(), shapes="4x4;8x8", backends="good", out=out, timer=FAST), progress=False)
    before = out.read_bytes()
    with pytest.raises(UsageError) as ei:
        _resume(out)
    assert "with another plan (cases added: 16x16 fp32); add --extend" in str(ei.value)
    with pytest.raises(UsageError, match=r"cases added: 4x4 bf16, 8x8 bf16; cases left out: 4x4 fp32, 8x8 fp32"):
        _resume(out, shapes="4x4;8x8", dtypes="bf16")
    with pytest.raises(UsageError, match=r'another plan \(timer \{"rep": 5, "warmup": 1\} -> \{"rep": 7\}\)'):
        run_sweep(SweepSpec(toy_op(), shapes="4x4;8x8", backends="good", out=out, resume=True, timer={"rep": 7}),
                  progress=False)
    assert out.read_bytes() == before and not journal_path(out).exists()
    df = _resume(out, extend=True)
    assert df["case"].tolist() == ["4x4", "8x8", "16x16"]
    assert len(df.attrs["sweeps"]) == 2
    assert len(_resume(out)) == 3  # the extended plan is the file's now


def test_resume_of_a_gemm_csv_with_rmsnorm_rows_is_refused(tmp_path):
    out = tmp_path / "r.csv"
    main(["sweep", "--op", "gemm", "--shapes", "8x8x8", "--backends", "aten", "--dtypes", "fp32", "--rep", "3",
          "--out", str(out), "--quiet"])
    before = out.read_bytes()
    with pytest.raises(UsageError, match="another plan"):  # a CSV keeps no plan: its rows say it
        run_sweep(SweepSpec("rmsnorm", shapes="8x8", dtypes="fp32", backends="aten", out=out, resume=True,
                            timer=FAST), progress=False)
    assert out.read_bytes() == before


def test_a_finished_csv_or_jsonl_keeps_its_plan_fingerprint_and_refuses_another(tmp_path):
    for ext in (".csv", ".jsonl"):
        out = tmp_path / f"r{ext}"
        run_sweep(SweepSpec(toy_op(), shapes="4x4", backends="good", out=out, timer=FAST), progress=False)
        first = R.load(out)["plan"].iloc[0]
        before = out.read_bytes()
        for kw in ({"shapes": "4x4;8x8"}, {"shapes": "4x4", "timer": {"rep": 9}}):
            with pytest.raises(UsageError) as ei:
                run_sweep(SweepSpec(toy_op(), backends="good", out=out, resume=True, **{"timer": FAST, **kw}),
                          progress=False)
            assert f"measured under plan {first}" in str(ei.value) and "--extend" in str(ei.value), ext
        assert out.read_bytes() == before and not journal_path(out).exists()
        assert len(_resume(out, shapes="4x4")) == 1  # the same plan goes on


def test_the_same_plan_typed_another_way_is_the_same_plan(tmp_path):
    out = tmp_path / "r.parquet"
    run_sweep(SweepSpec(toy_op(), shapes="4x4;4x4", dtypes="fp32,fp32", backends="good,good", out=out, timer=FAST),
              progress=False)
    df = run_sweep(SweepSpec(toy_op(), shapes="4x4", dtypes=["fp32"], backends="good", out=out, resume=True,
                             timer=FAST), progress=False)
    assert len(df) == 1


def test_odd_names_and_links(tmp_path):
    # '#', '?' and '%' are file-name characters, not URI syntax, in the journal's read-only looks
    out = tmp_path / "x#y?z%20.parquet"
    run_sweep(SweepSpec(toy_op(), shapes="4x4;8x8", backends="good", out=out, timer=FAST), progress=False)
    j = Journal.open(out, resume=False, overwrite=True, extend=False, retry_failed=False, plan_fingerprint="x",
                     plan={}, op="toy", keys=[])
    try:
        with pytest.raises(UsageError, match=rf"being written by another sweep \(pid {os.getpid()} on "):
            Journal.open(out, resume=True, overwrite=False, extend=False, retry_failed=False,
                         plan_fingerprint="x", plan={}, op="toy", keys=[])
        j.con.close()
    finally:
        j.lock.release()
    # the --overwrite journal left behind: a resume must not bring the replaced rows back
    df = _resume(out, shapes="4x4", extend=True)
    assert df["case"].tolist() == ["4x4"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x#y?z%20.parquet"]   # the lock is removed when let go
    # a link is written through, not replaced, and it is one output with its target
    real, link = tmp_path / "real.parquet", tmp_path / "link.parquet"
    run_sweep(SweepSpec(toy_op(), shapes="4x4", backends="good", out=real, timer=FAST), progress=False)
    link.symlink_to(real.name)
    df = _resume(link, shapes="4x4;8x8", extend=True)
    assert link.is_symlink() and len(df) == 2 and len(R.load(real)) == 2


def test_a_foreign_database_at_the_journal_path_is_refused_untouched(tmp_path):
    out = tmp_path / "o.parquet"
    con = sqlite3.connect(journal_path(out))
    con.execute("CREATE TABLE rows (x)")
    con.commit()
    con.close()
    before = journal_path(out).read_bytes()
    with pytest.raises(UsageError, match=r"o.parquet.journal.sqlite' is not a flyexplore journal \(its tables: rows\)"):
        _resume(out)
    assert journal_path(out).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.parquet.journal.sqlite"]   # no lock left
    with pytest.raises(UsageError, match="has the journal of an unfinished sweep"):
        run_sweep(SweepSpec(toy_op(), shapes="4x4", backends="good", out=out, timer=FAST), progress=False)


def test_an_old_partial_jsonl_journal_is_read_and_its_torn_line_dropped(tmp_path):
    full = tmp_path / "full.jsonl"
    run_sweep(SweepSpec(toy_op(), shapes="4x4;8x8", backends="good", out=full, timer=FAST), progress=False)
    # rows as flyexplore before the SQLite journal wrote them: no plan fingerprint
    lines = [json.dumps({k: v for k, v in json.loads(x).items() if k != "plan"}) for x in full.read_text().splitlines()]
    out = tmp_path / "r.parquet"
    legacy_journal_path(out).write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])  # torn mid-write
    ran = []
    df = run_sweep(SweepSpec(toy_op(), shapes=SHAPES, backends="good", out=out, resume=True, timer=FAST),
                   progress=False, on_row=ran.append)
    assert [r["case"] for r in ran] == ["8x8", "16x16"]
    assert df["case"].tolist() == ["4x4", "8x8", "16x16"]
    assert any("torn last line 2" in n for n in df.attrs[NOTES_ATTR])
    assert not legacy_journal_path(out).exists()
    # a bad line in the middle is damage, not a torn write: refused, nothing changed
    out2 = tmp_path / "r2.parquet"
    legacy_journal_path(out2).write_text(lines[0] + "\n{not json\n" + lines[1] + "\n")
    with pytest.raises(UsageError, match=r"r2.parquet.partial.jsonl' line 2 is not a result row"):
        _resume(out2)
    assert not out2.exists() and not journal_path(out2).exists()


def test_overwrite_then_crash_then_resume_does_not_bring_the_old_rows_back(tmp_path):
    out = tmp_path / "r.parquet"
    R.save(R.frame([{"op": "toy", "case": "99x99", "dtype": "fp32", "backend": "good", "status": "error",
                     "run_id": "old", "source": "measured"}]), out)
    j = Journal.open(out, resume=False, overwrite=True, extend=False, retry_failed=False, plan_fingerprint="x",
                     plan={}, op="toy", keys=[])
    j.con.close()
    j.lock.release()  # as a crash leaves it: the journal there, the old file untouched
    assert R.load(out)["case"].tolist() == ["99x99"]
    df = _resume(out, shapes="4x4", extend=True)  # the crashed journal's plan was another one
    assert df["case"].tolist() == ["4x4"] and R.load(out)["case"].tolist() == ["4x4"]


def test_leftover_temp_files_of_a_killed_write_are_removed_at_the_next_start(tmp_path):
    out = tmp_path / "r.parquet"
    junk = tmp_path / ".r.parquet.abc123.tmp"
    junk.write_bytes(b"x" * 1000)
    other = tmp_path / ".other.parquet.abc123.tmp"
    other.write_bytes(b"x")
    run_sweep(SweepSpec(toy_op(), shapes="4x4", backends="good", out=out, timer=FAST), progress=False)
    assert not junk.exists() and other.exists()


def _gemm_sweep_cmd(out, cases: int, rep: int) -> list[str]:
    """``flyexplore sweep`` of ``cases`` square fp32 ATen GEMMs (8, 16, ... 8 * cases), in a
    process of its own, writing ``out``."""
    return [sys.executable, "-m", "flyexplore", "sweep", "--op", "gemm", "--shapes",
            ";".join(f"{n}x{n}x{n}" for n in range(8, 8 + 8 * cases, 8)), "--backends", "aten", "--dtypes", "fp32",
            "--rep", str(rep), "--out", str(out), "--quiet"]


@pytest.mark.slow
def test_a_full_disk_mid_sweep_is_one_line_and_resume_completes(tmp_path, capsys):
    """The sweep under a file-size limit runs in a process of its own (the limit would hold this
    one too); the resume runs here, through the same CLI ``main``."""
    out = tmp_path / "r.parquet"
    cmd = _gemm_sweep_cmd(out, cases=12, rep=3)

    def small_disk():  # a file-size limit: writes past it fail with EFBIG, as on a full disk
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (150_000, 150_000))

    p = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=small_disk, timeout=600, cwd=ROOT)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert err[0].startswith("flyexplore: error: cannot write the journal") and "--resume" in err[0], err
    kept = committed_rows(out)
    assert 0 < len(kept) < 12 and not kept.duplicated(list(R.KEY)).any()
    capsys.readouterr()
    rc = main(cmd[3:] + ["--resume"])        # cmd: python -m flyexplore sweep ...
    assert rc == 0, capsys.readouterr().err[-3000:]
    df = R.load(out)
    assert len(df) == 12 and not df.duplicated(list(R.KEY)).any()
    # the rows committed before the disk filled are the file's, unchanged; the rest ran in the resume
    by_case = df.set_index("case")
    for r in kept.itertuples():
        assert by_case.loc[r.case, "run_id"] == r.run_id and by_case.loc[r.case, "time_ms"] == r.time_ms
    assert df["run_id"].nunique() == 2


@pytest.mark.slow
def test_a_journal_that_a_full_disk_keeps_from_being_created_leaves_nothing(tmp_path):
    """Issue 33, defect 9c: ``sweep --resume`` on a really full disk (``tests/full_disk.py``) said
    "move it away" about the 0-byte journal the run itself had just made. Now: one line naming
    the journal and SQLite's reason, and no journal left for the next run to trip on."""
    got = run_cases(tmp_path, ["sweep-journal:new"])
    r, mode = got["sweep-journal:new"], got["_mode"]
    err = r["err"].splitlines()
    assert r["rc"] == 2 and len(err) == 1 and "Traceback" not in r["err"], r["err"]
    assert err[0].startswith(f"flyexplore: error: cannot create the journal {r['target']!r}: "), err
    assert err[0].endswith("; nothing was left behind") and "move it away" not in err[0], err
    if mode == "tmpfs":   # ENOSPC; under RLIMIT_FSIZE SQLite reads EFBIG as "disk I/O error"
        assert "database or disk is full" in err[0], err
    # nothing is new, the writer lock included (issue 45: it is removed when let go)
    assert set(r["after"]) == set(r["before"]), r["after"]


def test_a_final_write_that_fails_keeps_the_journal_whole_for_resume(tmp_path, monkeypatch):
    out = tmp_path / "r.parquet"
    real = R.save

    def refuse(df, path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(R, "save", refuse)
    with pytest.raises(UsageError) as ei:
        run_sweep(SweepSpec(toy_op(), shapes="4x4;8x8", backends="good", out=out, timer=FAST), progress=False)
    assert "cannot write" in str(ei.value) and "Permission denied" in str(ei.value) and "--resume" in str(ei.value)
    assert len(committed_rows(out)) == 2 and not out.exists()
    monkeypatch.setattr(R, "save", real)
    ran = []
    df = run_sweep(SweepSpec(toy_op(), shapes="4x4;8x8", backends="good", out=out, resume=True, timer=FAST),
                   progress=False, on_row=ran.append)
    assert ran == [] and len(df) == 2 and len(R.load(out)) == 2


def test_journal_rows_keep_floats_exactly(tmp_path):
    out = tmp_path / "r.parquet"
    df = run_sweep(SweepSpec(toy_op(), shapes="4x4", backends="good", out=out, timer=FAST), progress=False)
    back = R.load(out)
    assert back["time_ms"].tolist() == df["time_ms"].tolist()
    assert json.loads(back["samples_ms"].iloc[0]) == json.loads(df["samples_ms"].iloc[0])


def test_a_damaged_journal_is_one_line_and_left_as_it_is(tmp_path, capsys):
    out = tmp_path / "r.parquet"
    journal_path(out).write_bytes(b"this is no database\n" * 50)
    before = journal_path(out).read_bytes()
    rc = main(["sweep", "--op", "gemm", "--shapes", "8x8x8", "--backends", "aten", "--dtypes", "fp32", "--rep", "3",
               "--out", str(out), "--quiet", "--resume"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "r.parquet.journal.sqlite" in err[0] and "move it away" in err[0], err
    assert journal_path(out).read_bytes() == before and not out.exists()


@pytest.mark.slow
def test_sigterm_keeps_the_finished_rows_like_ctrl_c(tmp_path):
    out = tmp_path / "r.csv"
    cmd = _gemm_sweep_cmd(out, cases=40, rep=200)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    _wait_rows(out, 2, p)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 143, err[-2000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"flyexplore: terminated; finished rows kept in {out}"), lines
    kept = R.load(out)
    assert 2 <= len(kept) < 40 and not journal_path(out).exists()
