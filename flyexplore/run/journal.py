"""A sweep's journal: every finished row committed at once to a SQLite database beside the result
file, so that no crash, kill or full disk can lose a finished row or write one twice.

Files beside a result file ``OUT`` (:func:`sidecar_files`):

- ``OUT.journal.sqlite`` (with SQLite's ``-wal``/``-shm`` while open): the journal. Python's
  :mod:`sqlite3`, write-ahead log (``journal_mode=WAL``) and ``synchronous=FULL``: a row is one
  transaction, and a committed transaction survives a crash of the process or of the machine
  (sqlite.org/wal.html, sqlite.org/pragma.html#pragma_synchronous); a torn write cannot exist
  (sqlite.org/atomiccommit.html). Tables:

  - ``rows``: one per result row, the row as JSON, keyed so that it cannot be written twice:
    ``UNIQUE(op, case, dtype, backend, run_id)`` (what :func:`flyexplore.results.table.validate`
    demands) and ``UNIQUE(op, case, dtype, backend, plan)`` for the rows a sweep wrote (``plan``
    = :meth:`flyexplore.run.spec.SweepSpec.plan_fingerprint`), across every resume.
  - ``passes``: the rows of one pass of a sweep that measures each case several times and
    combines them (``--processes``' fresh worker processes, :mod:`flyexplore.run.processes`; an
    environment A/B's fresh pairs of workers, :mod:`flyexplore.run.envab`),
    ``UNIQUE(op, case, dtype, backend, plan, pass)``, written as each case of a pass finishes
    (:meth:`Journal.add_passes`); a resume goes on with the passes still missing, and the
    combined row goes to ``rows`` when a case's last pass is in. The result file is written from
    ``rows`` alone; while a pass row waits for its case's other passes the journal is kept.
  - ``plans``: the plans whose rows the journal holds (fingerprint and
    :meth:`~flyexplore.run.spec.SweepSpec.plan_dict`). A resume with another plan is refused
    with one line naming what differs, unless it says ``extend``.
  - ``sweeps``: :func:`flyexplore.run.sweep.sweep_record` of every run (the result frame's
    ``attrs["sweeps"]``).
  - ``meta``: the journal's format and the process that holds it (``owner``).
- ``.OUT.lock`` (hidden, empty): the writer lock (:class:`WriterLock`: :mod:`filelock`, ``flock(2)``), there only
  while a sweep holds it: a sweep removes it when it lets go, on success and on every refusal or
  failure alike (a full disk included). A second sweep on the same ``OUT`` is refused with one
  line naming the process that holds it; the kernel drops the lock of a process that died, so
  the next sweep takes it over (a killed sweep's lock file stays until then).

When a sweep resumes ``OUT``, the rows of ``OUT`` (and of an old ``OUT.partial.jsonl`` journal of
earlier flyexplore versions: complete lines kept, a torn last line dropped with a note) are
imported into the journal first, each at most once; the journal is then the one source of the
rows, and the final file is written from it (atomically, by
:func:`flyexplore.results.table.save`) before the journal is deleted. A kill between the two
steps, or at any other moment, leaves a journal whose next import skips every row it already
has. Temporary files that an interrupted atomic write left (``.OUT.*.tmp``) are removed when a
sweep takes the lock.
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import socket
import sqlite3
import time
from pathlib import Path
from typing import Iterator, Sequence

import pandas as pd
from filelock import FileLock, Timeout

from flyexplore.errors import UsageError
from flyexplore.results import table as R

#: The journal's layout version (``meta.format``); a journal of another version is refused.
FORMAT = 1
#: Statuses of rows that ``retry_failed`` runs again (their rows are replaced by the new ones):
#: cases whose worker died or hung, and cases refused for their memory estimate.
RETRIED = ("crashed", "timeout", "refused")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS plans (n INTEGER PRIMARY KEY AUTOINCREMENT, fingerprint TEXT UNIQUE NOT NULL,
                                  plan TEXT NOT NULL, created TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sweeps (n INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT UNIQUE NOT NULL,
                                   record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rows (seq INTEGER PRIMARY KEY AUTOINCREMENT, op TEXT NOT NULL,
                                 "case" TEXT NOT NULL, dtype TEXT NOT NULL, backend TEXT NOT NULL,
                                 run_id TEXT NOT NULL, plan TEXT, rank INTEGER, status TEXT,
                                 row_plan TEXT, row TEXT NOT NULL,
                                 UNIQUE(op, "case", dtype, backend, run_id),
                                 UNIQUE(op, "case", dtype, backend, plan));
CREATE TABLE IF NOT EXISTS passes (seq INTEGER PRIMARY KEY AUTOINCREMENT, op TEXT NOT NULL,
                                   "case" TEXT NOT NULL, dtype TEXT NOT NULL, backend TEXT NOT NULL,
                                   plan TEXT, pass INTEGER NOT NULL, status TEXT, row TEXT NOT NULL,
                                   UNIQUE(op, "case", dtype, backend, plan, pass));
"""


#: What a refused resume with another plan says to do, in ``sweep``'s flags; a command without
#: ``--extend`` (``model --measure``) says its own (:func:`flyexplore.cli.model.run`).
ANOTHER_PLAN_FIX = "add --extend to add this plan's cases to the file, or choose another --out"


class JournalError(UsageError):
    """A journal write failed (a full disk, a folder made read-only): every row committed before
    is in the journal, and ``--resume`` goes on from it. One line on the command line, exit 2."""


def journal_path(out: str | os.PathLike) -> Path:
    """The SQLite journal beside a result file: ``<out>.journal.sqlite``."""
    return Path(str(out) + ".journal.sqlite")


def legacy_journal_path(out: str | os.PathLike) -> Path:
    """The JSON Lines journal of flyexplore before the SQLite one: ``<out>.partial.jsonl`` (read on
    resume, never written)."""
    return Path(str(out) + ".partial.jsonl")


def lock_path(out: str | os.PathLike) -> Path:
    """The writer lock of a result file: the hidden, empty ``.<name>.lock`` in its folder."""
    p = Path(out)
    return p.with_name(f".{p.name}.lock")


class WriterLock(FileLock):
    """The writer lock of a result file (:func:`lock_path`): :class:`filelock.FileLock` (an
    exclusive ``flock(2)`` on a hidden empty file, taken without waiting), whose file
    :meth:`release` removes while it still holds the lock, so that a finished, refused or failed
    sweep leaves no ``.<name>.lock`` behind (filelock keeps its file on Unix).

    Removing it is safe because filelock (>= 4) takes a lock only on a file that still has a name:
    a sweep that opened the file just before it was removed finds it nameless once locked and
    opens the path again. A process that dies holding the lock loses it (the kernel drops a flock
    with its last descriptor); its file stays and the next sweep takes it."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(str(path), timeout=0)

    def release(self, force: bool = False) -> None:
        """Remove the lock file (only when this object holds the last level of the lock), then let
        go of the lock. A file that cannot be removed (a folder made read-only meanwhile) stays,
        harmless: the next sweep locks it."""
        if self.is_locked and (force or self.lock_counter <= 1):
            with contextlib.suppress(OSError):
                os.unlink(self.lock_file)
        super().release(force)


def sidecar_files(out: str | os.PathLike) -> tuple[str, ...]:
    """Names of the files a sweep may keep beside ``out`` while it runs (journal, SQLite's
    ``-wal``/``-shm``, the lock, the legacy journal), for folders that list what they hold."""
    j = journal_path(out).name
    return (j, j + "-wal", j + "-shm", lock_path(out).name, legacy_journal_path(out).name)


def leftovers(out: str | os.PathLike) -> list[Path]:
    """Temporary files of interrupted atomic writes of ``out`` (``.<name>.*.tmp``, the names
    :func:`flyexplore.atomic.temp_for` gives)."""
    p = Path(out)
    folder = p.parent if str(p.parent) else Path(".")
    return [Path(x) for x in glob.glob(os.path.join(glob.escape(str(folder)), f".{glob.escape(p.name)}.*.tmp"))]


def check_new(out: str | os.PathLike, overwrite: bool = False) -> None:
    """Refuse to start a sweep (not a resume) on ``out`` when ``out``, its journal or an old
    ``.partial.jsonl`` journal is there, unless ``overwrite``: one :class:`UsageError` line saying
    that ``--resume`` continues it and ``--overwrite`` replaces it (``sweep`` and ``model --measure``
    both take them). Reads only; :meth:`Journal.open` calls it, and ``model --measure`` before its
    capture, so that the refusal comes first."""
    out = Path(out)
    there = [p for p in (out, journal_path(out), legacy_journal_path(out)) if p.exists()]
    if there and not overwrite:
        what = (f"output file {str(out)!r} exists" if out in there else
                f"output file {str(out)!r} has the journal of an unfinished sweep, {str(there[0])!r}")
        raise UsageError(f"{what} (use --resume to continue it, --overwrite to replace it, "
                         "or choose another path)")


def frame_rows(df: pd.DataFrame) -> list[dict]:
    """The rows of a result frame as JSON-ready dicts (NA left out; cells as
    :func:`flyexplore.results.table.json_value` writes them)."""
    cols = list(df.columns)
    out = []
    for values in df.itertuples(index=False, name=None):
        out.append({c: j for c, v in zip(cols, values) if (j := R.json_value(v)) is not None})
    return out


def _key(row: dict) -> tuple[str, str, str, str]:
    return tuple(str(row.get(k) if row.get(k) is not None else "") for k in R.KEY)  # type: ignore[return-value]


#: The most characters of a value a plan difference shows whole (:func:`plan_difference`).
SHOWN = 60


def _text(v) -> str:
    return json.dumps(v, sort_keys=True) if not isinstance(v, str) else repr(v)


def _short(v, n: int = SHOWN) -> str:
    t = _text(v)
    return t if len(t) <= n else t[: n - 3] + "..."


def _short_pair(a, b, n: int = SHOWN) -> tuple[str, str]:
    """Two values as text of at most ``n`` characters each, cut around their first difference (so
    that two long texts that differ near their end do not read the same): ``...X": "1"}]`` and
    ``...X": "2"}]``."""
    ta, tb = _text(a), _text(b)
    if len(ta) <= n and len(tb) <= n:
        return ta, tb
    i = next((k for k, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
    start = max(0, i - n // 3)

    def cut(t: str) -> str:
        head = "..." if start else ""
        body = t[start:start + n - len(head)]
        return head + (body if start + len(body) >= len(t) else body[:-3] + "...")
    return cut(ta), cut(tb)


_ABSENT = object()


def _leaf_differences(a, b, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], object, object]]:
    """``(path, old, new)`` of each differing leaf of two JSON values: mappings key by key, lists
    of one length item by item (an item named by its ``name`` when both sides share it, an
    environment's), anything else whole. A key on one side only is :data:`_ABSENT` on the other."""
    if a == b:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for k in dict.fromkeys([*a, *b]):
            yield from _leaf_differences(a.get(k, _ABSENT), b.get(k, _ABSENT), (*path, str(k)))
        return
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            name = x.get("name") if isinstance(x, dict) and isinstance(y, dict) else None
            label = repr(name) if isinstance(name, str) and name and name == y.get("name") else str(i)
            yield from _leaf_differences(x, y, (*path, f"[{label}]"))
        return
    yield path, a, b


def _value_change(path: tuple[str, ...], a, b) -> str:
    where = "".join(p if p.startswith("[") or not i else "." + p for i, p in enumerate(path))
    if a is _ABSENT:
        return f"{where} added: {_short(b)}"
    if b is _ABSENT:
        return f"{where} left out (was {_short(a)})"
    ta, tb = _short_pair(a, b)
    return f"{where} {ta} -> {tb}"


def _listed(items: list[str], n: int = 3) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def plan_difference(old: dict, new: dict) -> str:
    """What differs between two :meth:`~flyexplore.run.spec.SweepSpec.plan_dict` values, in words:
    ``cases added: 16x16x16 fp32; timer {"rep": 3} -> {"rep": 5}``. A value whose text is too long
    to show whole (over 60 characters) is named by the leaves that differ, each cut around its
    first difference: ``envs['a'].changes.X '1' -> '2'`` for an ``--env a:...,X=1`` resumed as
    ``--env a:...,X=2`` (issue 45: two cut texts read the same), at most 3 of them."""
    out = []
    for k in dict.fromkeys([*old, *new]):
        a, b = old.get(k, _ABSENT), new.get(k, _ABSENT)
        if a == b:
            continue
        if k == "cases" and isinstance(a, list) and isinstance(b, list):
            added, dropped = [c for c in b if c not in a], [c for c in a if c not in b]
            parts = ([f"cases added: {_listed(added)}"] if added else []) + (
                [f"cases left out: {_listed(dropped)}"] if dropped else [])
            out.append("; ".join(parts) or "the cases in another order")
        elif a is not _ABSENT and b is not _ABSENT and len(_text(a)) <= SHOWN and len(_text(b)) <= SHOWN:
            out.append(f"{k} {_text(a)} -> {_text(b)}")
        else:
            leaves = list(_leaf_differences(a, b, (k,)))
            out.append(_listed([_value_change(*x) for x in leaves]))
    return "; ".join(out)


def read_legacy(path: Path) -> tuple[list[dict], str | None]:
    """The rows of an old ``.partial.jsonl`` journal and a note when its torn last line (a write
    cut by a crash: no final newline, not JSON) was dropped. Raises :class:`UsageError` naming the
    file and line for a bad line anywhere else (that is damage, not a torn write)."""
    try:
        text = path.read_text(encoding="utf-8", errors="strict")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the old journal {str(path)!r}: {getattr(exc, 'strerror', None) or exc}") from None
    lines = text.split("\n")
    rows, note = [], None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            if i == len(lines) and not text.endswith("\n"):
                note = f"dropped the torn last line {i} of the old journal {str(path)!r} (a write cut by a crash)"
                break
            raise UsageError(f"old journal {str(path)!r} line {i} is not a result row ({exc}); "
                             "move the file away to start without it") from None
        rows.append(row)
    return rows, note


@contextlib.contextmanager
def _tx(con: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``), rolled back on any error."""
    con.execute("BEGIN IMMEDIATE")
    try:
        yield con
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def _read_only(journal: Path, timeout: float = 2.0) -> sqlite3.Connection:
    """A read-only connection to ``journal`` (a ``file:`` URI with the path percent-encoded, so
    that ``#``, ``?`` or ``%`` in a file name are the name, not URI syntax)."""
    return sqlite3.connect(Path(journal).absolute().as_uri() + "?mode=ro", uri=True, timeout=timeout)


def _meta(journal: Path, key: str) -> str | None:
    """A ``meta`` value of a journal (read-only; None when absent or unreadable)."""
    if not journal.exists():
        return None
    try:
        con = _read_only(journal)
        try:
            got = con.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        return None
    return got[0] if got else None


def _replaces_out(journal: Path) -> bool:
    """Whether the journal belongs to an ``--overwrite`` sweep (its result file is not imported)."""
    return _meta(journal, "replaces_out") == "1"


def _owner_text(journal: Path) -> str:
    """Who holds a journal, from its ``meta.owner`` (read-only; '' when it cannot be read)."""
    try:
        o = json.loads(_meta(journal, "owner") or "null")
    except ValueError:
        return ""
    if not isinstance(o, dict):
        return ""
    if o.get("host") == socket.gethostname():  # an owner record left by a sweep that died is no holder
        try:
            os.kill(int(o.get("pid")), 0)
        except ProcessLookupError:
            return ""
        except (PermissionError, TypeError, ValueError, OverflowError):
            pass
    return f"pid {o.get('pid')} on {o.get('host')}, since {o.get('since')}"


class Journal:
    """The open journal of one sweep on ``out`` (see the module text); used by
    :func:`flyexplore.run.sweep.run_sweep`. Open it with :meth:`open`; :meth:`add` commits a row,
    :meth:`frame` reads every row back in order, :meth:`finish` writes the result file and
    removes the journal, :meth:`close` releases the lock (always call it)."""

    def __init__(self, out: Path, con: sqlite3.Connection, lock, plan: str, rank: dict, retry: bool):
        self.out, self.path, self.con, self.lock = out, journal_path(out), con, lock
        self.plan, self.rank, self.retry = plan, rank, retry
        self.notes: list[str] = []
        self.added = 0

    # -- opening ---------------------------------------------------------------------------------

    @classmethod
    def open(cls, out: Path, *, resume: bool, overwrite: bool, extend: bool, retry_failed: bool,
             plan_fingerprint: str, plan: dict, op: str, keys: Sequence[tuple[str, str, str]]) -> Journal:
        """Take ``out``'s writer lock and open (or create) its journal for a sweep of ``plan``
        (``plan_fingerprint``, ``op`` and the plan's ``(case, dtype, backend)`` keys in order).

        Without ``resume``: an existing ``out`` or journal is refused unless ``overwrite``, which
        removes them (the old result file only when the new one is written). With ``resume``:
        ``out``'s rows and an old ``.partial.jsonl`` journal's are imported (each row at most
        once) and the plan is checked against the plans whose rows the file holds: another plan is
        refused (naming what differs) unless ``extend``.

        Raises :class:`UsageError` (one line, nothing changed) when another process holds the
        lock (its pid and host named), when ``out`` or a journal is damaged or holds rows of
        another operator or plan, or when the journal cannot be created (the OS's reason)."""
        lock = WriterLock(lock_path(out))
        try:
            lock.acquire()
        except Timeout:
            who = _owner_text(journal_path(out))
            raise UsageError(f"output file {str(out)!r} is being written by another sweep"
                             + (f" ({who})" if who else "") + "; wait for it to finish, or choose another --out") from None
        except OSError as exc:
            raise UsageError(f"cannot lock output file {str(out)!r}: {exc.strerror or exc}") from None
        try:
            return cls._open_locked(out, lock, resume=resume, overwrite=overwrite, extend=extend,
                                    retry_failed=retry_failed, plan_fingerprint=plan_fingerprint, plan=plan,
                                    op=op, keys=keys)
        except BaseException:
            lock.release()
            raise

    @classmethod
    def _open_locked(cls, out, lock, *, resume, overwrite, extend, retry_failed, plan_fingerprint, plan, op,
                     keys) -> Journal:
        jp, legacy = journal_path(out), legacy_journal_path(out)
        for tmp in leftovers(out):
            with contextlib.suppress(OSError):
                tmp.unlink()
        if not resume:
            check_new(out, overwrite)
            _remove(jp)
            with contextlib.suppress(FileNotFoundError):
                legacy.unlink()
        # read what a resume brings before the journal is created: damage is refused untouched
        old, records, note = None, [], None
        if resume:
            if out.exists() and not _replaces_out(jp):
                old = R.load(out)
                records = list(old.attrs.get("sweeps", []))
            legacy_rows, note = read_legacy(legacy) if legacy.exists() else ([], None)
        created = not jp.exists()
        if not created:
            _check_existing(jp)  # a foreign or future database is refused before anything is written
        con = _connect(jp, created)
        try:
            j = cls(out, con, lock, plan_fingerprint, {k: i for i, k in enumerate(keys)}, retry_failed)
            if note:
                j.notes.append(note)
            j._own(replaces_out=overwrite)
            if resume:
                rows = (frame_rows(old) if old is not None else []) + legacy_rows
                j._import(rows, records)
                j._check_plan(plan_fingerprint, plan, op, set(keys), extend)
            else:
                j._add_plan(plan_fingerprint, plan)
            if legacy.exists():
                legacy.unlink()  # its rows are committed in the journal now
        except sqlite3.Error as exc:
            con.close()
            _remove(jp, created)
            raise UsageError(f"cannot write the journal {str(jp)!r}: {exc}; nothing was changed") from None
        except BaseException:
            con.close()
            _remove(jp, created)  # a refused resume leaves no journal behind
            raise
        return j

    def _own(self, replaces_out: bool = False) -> None:
        owner = {"pid": os.getpid(), "host": socket.gethostname(),
                 "since": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
        with _tx(self.con):  # an existing journal's format was checked before it was opened (_check_existing)
            self.con.execute("INSERT OR REPLACE INTO meta VALUES ('format', ?)", (str(FORMAT),))
            self.con.execute("INSERT OR REPLACE INTO meta VALUES ('owner', ?)", (json.dumps(owner),))
            if replaces_out:  # --overwrite: a resume after a crash must not bring the old file back
                self.con.execute("INSERT OR REPLACE INTO meta VALUES ('replaces_out', '1')")

    def _import(self, rows: list[dict], records: list[dict]) -> None:
        """Commit rows of the result file and old journal not yet in the journal (one
        transaction; a row already there by (op, case, dtype, backend, run_id) is skipped)."""
        with _tx(self.con):
            for rec in records:
                if isinstance(rec, dict) and rec.get("run_id"):
                    self.con.execute("INSERT OR IGNORE INTO sweeps (run_id, record) VALUES (?, ?)",
                                     (str(rec["run_id"]), json.dumps(rec, default=str)))
            for row in rows:
                op, case, dtype, backend = _key(row)
                self.con.execute(
                    'INSERT OR IGNORE INTO rows (op, "case", dtype, backend, run_id, plan, rank, status, row_plan, '
                    "row) VALUES (?, ?, ?, ?, ?, NULL, NULL, ?, ?, ?)",
                    (op, case, dtype, backend, str(row.get("run_id") or ""), row.get("status"), row.get("plan"),
                     json.dumps(row, default=str, allow_nan=True)))

    def _add_plan(self, fingerprint: str, plan: dict) -> None:
        with _tx(self.con):
            self.con.execute("INSERT OR IGNORE INTO plans (fingerprint, plan, created) VALUES (?, ?, ?)",
                             (fingerprint, json.dumps(plan, sort_keys=True),
                              time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())))

    def _known_plans(self) -> tuple[list[tuple[str, dict]], set[str]]:
        """The plans whose rows the file holds: ``([(fingerprint, plan dict)], fingerprints)``.
        Dicts from the journal's plans and from the sweep records a Parquet file keeps (those of
        this flyexplore: ``plan``); fingerprints also from the rows' ``plan`` column (all that a
        CSV or JSONL file keeps)."""
        dicts = [(fp, json.loads(p)) for fp, p in self.con.execute("SELECT fingerprint, plan FROM plans ORDER BY n")]
        for (rec,) in self.con.execute("SELECT record FROM sweeps ORDER BY n"):
            r = json.loads(rec)
            if isinstance(r.get("plan"), dict) and r.get("plan_fingerprint"):
                dicts.append((str(r["plan_fingerprint"]), r["plan"]))
        fps = {fp for fp, _ in dicts}
        fps |= {fp for (fp,) in self.con.execute("SELECT DISTINCT row_plan FROM rows WHERE row_plan IS NOT NULL")}
        return dicts, fps

    def _check_plan(self, fingerprint: str, plan: dict, op: str, keys: set, extend: bool) -> None:
        """Refuse a resume whose plan is not the file's (see :meth:`open`): named by what differs
        where the file keeps its plan, else by its fingerprint and what its rows show."""
        dicts, fps = self._known_plans()
        if fingerprint in fps or extend:
            self._add_plan(fingerprint, plan)
            return
        where = f"--resume of {str(self.out)!r} with another plan"
        fix = ANOTHER_PLAN_FIX
        if dicts:
            raise UsageError(f"{where} ({plan_difference(dicts[-1][1], plan)}); {fix}")
        ops = sorted({o for (o,) in self.con.execute("SELECT DISTINCT op FROM rows")} - {op})
        if ops:
            raise UsageError(f"{where}: it holds {', '.join(ops)} rows, this sweep is {op}; {fix}")
        extra = [r for r in self.con.execute('SELECT "case", dtype, backend FROM rows') if tuple(r) not in keys]
        if extra:
            c, d, b = extra[0]
            raise UsageError(f"{where}: {len(extra)} of its rows are not in this plan (e.g. {c} {d} {b}); {fix}")
        if fps:
            raise UsageError(f"{where}: its rows were measured under plan {', '.join(sorted(fps))}, this sweep's "
                             f"is {fingerprint} (the file keeps only the plan's fingerprint, so what differs "
                             "cannot be named: the cases, backends, timer, seed, order, band, baseline, trace or "
                             f"device; a .parquet file keeps the plan itself); {fix}")
        self._add_plan(fingerprint, plan)  # rows of an older flyexplore: their cases are this plan's

    # -- rows ------------------------------------------------------------------------------------

    def done(self) -> set[tuple[str, str, str, str]]:
        """The (op, case, dtype, backend) keys the journal holds; with ``retry_failed`` those
        whose every row is ``crashed``/``timeout`` are left out (they run again)."""
        keys: dict[tuple, bool] = {}
        for op, c, d, b, st in self.con.execute('SELECT op, "case", dtype, backend, status FROM rows'):
            k = (op, c, d, b)
            keys[k] = keys.get(k, False) or not (self.retry and st in RETRIED)
        return {k for k, kept in keys.items() if kept}

    def add(self, row: dict) -> bool:
        """Commit ``row`` (one transaction; fsynced). Returns False, writing nothing, when the
        journal already holds its key for this plan or run (never a second row); with
        ``retry_failed`` a ``crashed``/``timeout`` row of the key is replaced. Raises
        :class:`JournalError` naming the journal and the OS's reason (a full disk, a folder made
        read-only) -- every row committed before stays."""
        op, case, dtype, backend = _key(row)
        text = json.dumps(row, default=str, allow_nan=True)
        try:
            with _tx(self.con):
                if self.retry:
                    self.con.execute('DELETE FROM rows WHERE op=? AND "case"=? AND dtype=? AND backend=? '
                                     f"AND status IN ({', '.join('?' * len(RETRIED))})",
                                     (op, case, dtype, backend, *RETRIED))
                cur = self.con.execute(
                    'INSERT OR IGNORE INTO rows (op, "case", dtype, backend, run_id, plan, rank, status, row_plan, '
                    "row) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (op, case, dtype, backend, str(row.get("run_id") or ""), self.plan,
                     self.rank.get((case, dtype, backend)), row.get("status"), row.get("plan"), text))
        except sqlite3.Error as exc:
            raise JournalError(f"cannot write the journal {str(self.path)!r}: {exc}; the {self.count()} rows "
                             "committed before are kept there: re-run with --resume once the disk has "
                             "space again") from None
        self.added += cur.rowcount
        return cur.rowcount == 1

    def add_passes(self, rows: Sequence[tuple[int, dict]]) -> None:
        """Commit the rows of one case in one pass (``(pass, row)`` each; one transaction, fsynced:
        a case's arms are never half-written). A pass row already there for this plan is replaced
        (a ``--retry-failed`` of a crashed pass). Raises :class:`JournalError` as :meth:`add`."""
        try:
            with _tx(self.con):
                for k, row in rows:
                    op, case, dtype, backend = _key(row)
                    self.con.execute(
                        'INSERT OR REPLACE INTO passes (op, "case", dtype, backend, plan, pass, status, row) '
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (op, case, dtype, backend, self.plan, int(k), row.get("status"),
                         json.dumps(row, default=str, allow_nan=True)))
        except sqlite3.Error as exc:
            raise JournalError(f"cannot write the journal {str(self.path)!r}: {exc}; every case's passes "
                               "committed before are kept there: re-run with --resume once the disk has "
                               "space again") from None

    def pass_rows(self) -> dict:
        """This plan's pass rows: ``{(case, dtype): {pass: {backend: row}}}``; with
        ``retry_failed`` the ``crashed``/``timeout`` ones are left out (those passes run again)."""
        out: dict = {}
        for c, d, b, k, st, row in self.con.execute(
                'SELECT "case", dtype, backend, pass, status, row FROM passes WHERE plan=? ORDER BY seq',
                (self.plan,)):
            if self.retry and st in RETRIED:
                continue
            out.setdefault((c, d), {}).setdefault(int(k), {})[b] = json.loads(row)
        return out

    def pending(self) -> int:
        """Pass rows whose key has no combined row yet (a case still missing a pass): while there
        are any, the journal must outlive the sweep (:meth:`finish` is not called)."""
        try:
            got = self.con.execute(
                'SELECT COUNT(*) FROM passes p WHERE NOT EXISTS (SELECT 1 FROM rows r WHERE r.op=p.op AND '
                'r."case"=p."case" AND r.dtype=p.dtype AND r.backend=p.backend AND r.status NOT IN '
                f"({', '.join('?' * len(RETRIED))}))", RETRIED if self.retry else ("",) * len(RETRIED)).fetchone()
        except sqlite3.Error:
            return 0
        return int(got[0])

    def count(self) -> int:
        """Rows in the journal (0 when it cannot be read)."""
        try:
            return int(self.con.execute("SELECT COUNT(*) FROM rows").fetchone()[0])
        except sqlite3.Error:
            return 0

    def add_record(self, record: dict) -> None:
        """Commit a run's :func:`~flyexplore.run.sweep.sweep_record` (once per run_id)."""
        try:
            with _tx(self.con):
                self.con.execute("INSERT OR IGNORE INTO sweeps (run_id, record) VALUES (?, ?)",
                                 (record["run_id"], json.dumps(record, default=str)))
        except sqlite3.Error as exc:
            raise JournalError(f"cannot write the journal {str(self.path)!r}: {exc}") from None

    def records(self) -> list[dict]:
        """Every run's sweep record, oldest first."""
        return [json.loads(r) for (r,) in self.con.execute("SELECT record FROM sweeps ORDER BY n")]

    def frame(self) -> pd.DataFrame:
        """Every row, as a normalized result frame: rows of the file first (as they were), then
        each plan's rows in the plan's order (rows of one case together, whatever worker
        finished first), with ``attrs["sweeps"]`` = :meth:`records`."""
        order = {fp: n for n, fp in self.con.execute("SELECT n, fingerprint FROM plans")}
        got = self.con.execute("SELECT plan, rank, seq, row FROM rows").fetchall()
        got.sort(key=lambda r: (order.get(r[0], 0) if r[0] is not None else 0,
                                r[1] if r[1] is not None else -1, r[2]))
        df = R.frame(json.loads(r[3]) for r in got)
        df.attrs["sweeps"] = self.records()
        return df

    # -- the end ---------------------------------------------------------------------------------

    def finish(self, df: pd.DataFrame) -> None:
        """Write ``df`` (this journal's :meth:`frame`) to the result file atomically, then remove
        the journal. Raises :class:`UsageError` naming the file and the OS's reason when the write
        fails; the journal then stays, whole, for ``--resume``."""
        try:
            R.save(df, self.out)
        except (OSError, UsageError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            raise UsageError(f"cannot write {str(self.out)!r}: {reason}; all {len(df)} rows are kept in the "
                             f"journal {str(self.path)!r}: re-run with --resume to write them") from None
        self.con.close()
        _remove(self.path)

    def close(self) -> None:
        """Close the database (if :meth:`finish` did not) and release the writer lock."""
        with contextlib.suppress(sqlite3.Error):
            self.con.close()
        self.lock.release()


def _journal_files(jp: Path) -> tuple[Path, Path, Path]:
    """A journal and SQLite's ``-wal`` and ``-shm`` files beside it."""
    return jp, Path(str(jp) + "-wal"), Path(str(jp) + "-shm")


def _remove(jp: Path, created: bool = True) -> None:
    """Remove a journal (and its -wal/-shm) when ``created`` (by this process: a refusal leaves
    what was there before)."""
    if created:
        for p in _journal_files(jp):
            with contextlib.suppress(OSError):
                p.unlink()


#: Tables and ``rows`` columns a journal of :data:`FORMAT` has.
_TABLES = {"meta", "plans", "sweeps", "rows"}
_ROW_COLUMNS = {"seq", "op", "case", "dtype", "backend", "run_id", "plan", "rank", "status", "row_plan", "row"}


def _check_existing(path: Path) -> None:
    """Refuse, reading only, a file at a journal's path that is not a journal of this format:
    another SQLite database, a journal of another format, or no database at all. A database
    without any table (a journal whose sweep died while creating it) is taken as a new one.
    Raises :class:`UsageError` naming the file."""
    move = "move it away to start without it"
    try:
        con = _read_only(path, timeout=10.0)
        try:
            tables = {n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if not tables:
                return
            if not _TABLES <= tables:
                raise UsageError(f"{str(path)!r} is not a flyexplore journal (its tables: "
                                 f"{', '.join(sorted(tables)[:6])}); {move}")
            cols = {r[1] for r in con.execute("PRAGMA table_info(rows)")}
            fmt = con.execute("SELECT value FROM meta WHERE key='format'").fetchone()
        finally:
            con.close()
    except sqlite3.Error as exc:
        raise UsageError(f"journal {str(path)!r} cannot be used ({exc}); {move}") from None
    if fmt is None or fmt[0] != str(FORMAT) or not _ROW_COLUMNS <= cols:
        raise UsageError(f"journal {str(path)!r} has format {fmt[0] if fmt else 'none'}, this flyexplore "
                         f"writes {FORMAT}; finish it with the flyexplore that made it, or {move}")


#: SQLite's primary result codes for the OS refusing a write or an open (``SQLITE_PERM``,
#: ``SQLITE_READONLY``, ``SQLITE_IOERR``, ``SQLITE_FULL``, ``SQLITE_CANTOPEN``): not damage of
#: the journal, so nothing to move away (https://sqlite.org/rescode.html).
_OS_REFUSED = {3, 8, 10, 13, 14}


def _connect(path: Path, created: bool) -> sqlite3.Connection:
    """Open (create, when ``created``) a journal: WAL, ``synchronous=FULL``, autocommit off
    (transactions by hand). Raises :class:`UsageError` naming the file when it cannot be opened
    or written (a full disk: SQLite's ``database or disk is full``; a journal this call created is
    removed again, so nothing is left for a later ``--resume`` to trip on) or is not a journal."""
    try:
        con = sqlite3.connect(str(path), timeout=10.0, isolation_level=None)
    except sqlite3.Error as exc:
        _remove(path, created)
        raise UsageError(f"cannot open the journal {str(path)!r}: {exc}") from None
    try:
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=FULL")
        con.executescript(_SCHEMA)
    except sqlite3.Error as exc:
        con.close()
        _remove(path, created)
        if created:
            raise UsageError(f"cannot create the journal {str(path)!r}: {exc}; nothing was left behind") from None
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF in _OS_REFUSED:
            raise UsageError(f"cannot write the journal {str(path)!r}: {exc}; nothing was changed") from None
        raise UsageError(f"journal {str(path)!r} cannot be used ({exc}); move it away to start without it") from None
    return con


def committed_rows(out: str | os.PathLike, *, passes: bool = False) -> pd.DataFrame:
    """The rows a journal of ``out`` holds now (read-only; it may belong to a running sweep), as a
    result frame; an empty frame when there is none. ``passes``: the pass rows instead (a
    ``--processes`` sweep's or an environment A/B's, each measurement of a case in one pass, not
    yet combined), with a ``pass`` column (0-based). Raises :class:`UsageError` for a damaged
    journal."""
    jp = journal_path(out)
    if not jp.exists():
        return R.empty_frame()
    query = 'SELECT pass, row FROM passes ORDER BY seq' if passes else "SELECT NULL, row FROM rows ORDER BY seq"
    try:
        con = _read_only(jp, timeout=10.0)
        try:
            got = con.execute(query).fetchall()
        finally:
            con.close()
    except sqlite3.Error as exc:
        if "no such table" in str(exc):  # a journal being created this moment
            return R.empty_frame()
        raise UsageError(f"cannot read the journal {str(jp)!r}: {exc}") from None
    df = R.frame(json.loads(r) for _, r in got)
    if passes:
        df.insert(0, "pass", [int(k) for k, _ in got])
    return df
