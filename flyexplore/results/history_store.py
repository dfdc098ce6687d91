"""The history store: every run added to it, kept for good (``flyexplore history add``,
``fx.history``). What is read from it -- trends, steps, the learned allowance, the exports -- is
:mod:`flyexplore.results.history`.

A store is a folder:

- ``runs/<run>.<digest>.parquet``: the rows one add brought of one run (a sweep's ``run_id``),
  whole, as :func:`flyexplore.results.table.save` writes them (samples and all). ``<run>`` is the
  ``run_id`` made safe for a file name (other characters ``_``, at most 80); ``<digest>`` is a
  BLAKE2b digest (8 bytes) of the ``run_id`` and the part's keys, so two parts have one name only
  for the same run and keys. A part the index names is never rewritten: a later add of that run
  and those keys finds every key in the index and writes no part. A later add of a run brings only
  the rows (keys) the store lacks, in a part of its own.
- ``history.sqlite`` (SQLite, :mod:`sqlite3`): the index, changed in one transaction per run an
  add brings -- ``meta`` (``format`` :data:`FORMAT`, layout ``version`` :data:`VERSION`),
  ``runs`` (one row per run: device, platform, arch, environment/build ``env_id`` and the A/B's
  environments, versions, ``flyexplore_commit``, ``plan``; ``env_ids``: each environment's
  ``env_id``; ``timestamp``: the earliest of its rows' timestamps, else, for rows without one,
  the time of its first add, ``added_at``, so every run has one and runs are ordered by
  ``timestamp`` then ``run_id`` alike in SQL and in pandas), ``points`` (one row per result row:
  the key ``op, case, dtype, backend, env``, ``status``, ``time_ms``, its 95% interval,
  ``device_key``: :func:`device_keys`) and ``parts`` (the Parquet files); indexed by device,
  ``env_id``, ``flyexplore_commit``, ``plan`` (``runs``) and ``device_key`` (``points``). Reading
  trends reads only this file: 1,000 runs x 100 cases in well under a second.
- ``.add.lock``: :class:`filelock.FileLock`, held by an add (two adds at once run one after the
  other).

Safety, by construction: an existing ``history.sqlite`` is first opened read-only and checked
(its ``meta``: format :data:`FORMAT`, a whole-number version up to :data:`VERSION`); a foreign
or damaged one, or one of a newer layout, is refused in one line, before the lock is taken and
with nothing written. The one change a check makes is SQLite's own: a hot rollback journal (a
writer killed mid-transaction) is rolled back, as any read-write open of the file does. A new
index is made whole under a temporary name (``.history.sqlite.*.tmp``) and renamed into place,
so no reader or other add ever sees a half-made one. A part is written whole under a temporary
name and renamed (:mod:`flyexplore.atomic`) before the index names it; the index changes in one
SQLite transaction. A ``kill -9`` before the commit leaves at most a part the index does not
name, which readers ignore: the next add of that run with the same keys writes it again under
the same name; one with other keys (some of them added meanwhile) writes a part of another name,
and the killed add's part stays, an orphan file the index never names. After the commit the add
is whole. A row the store already has (same run and key) is never added twice, so adding a file
twice changes nothing; a known row whose ``time_ms`` differs is kept as stored, and the add's
line says how many. A ``run_id`` names one sweep: rows of a stored run from another device
(:func:`device_keys`), ``env_id`` (per environment) or ``plan`` are refused, the whole add,
before anything is written. A file that is not a whole result file is refused before anything
is written (:func:`flyexplore.results.table.load`).

The default store (when none is given) is ``$FLYEXPLORE_HISTORY``, else
``$XDG_DATA_HOME/flyexplore/history``, else ``~/.local/share/flyexplore/history``
(:func:`default_store`).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from flyexplore import atomic
from flyexplore.errors import UsageError
from flyexplore.results import table as R
from flyexplore.results.arms import split_arm
from flyexplore.results.series import run_order

#: What ``history.sqlite`` says it is (its ``meta`` table), and the layout's version.
FORMAT = "flyexplore-history"
VERSION = 1
INDEX = "history.sqlite"
PARTS = "runs"
LOCK = ".add.lock"
#: The names a store's folder holds besides its index (SQLite's journals, the lock, the parts,
#: and ``.history.sqlite.*`` temporary files of a new index): not "other files".
OWN_NAMES = frozenset({INDEX, INDEX + "-journal", INDEX + "-wal", INDEX + "-shm", LOCK, PARTS})
#: How long an add waits for another add of the same store, s.
LOCK_TIMEOUT_S = 600.0

#: The run-level columns the index keeps (each the run's first non-empty value; ``device_id`` all
#: of them, comma-separated): what a series is grouped and ordered by.
RUN_FIELDS = ("device", "device_id", "platform", "arch", "env_id", "torch", "torch_git", "triton", "flydsl",
              "aotriton", "gpu_runtime", "flyexplore", "flyexplore_commit", "plan", "timing_mode")
#: The per-row columns the index keeps (besides the key).
POINT_FIELDS = ("status", "source", "time_ms", "time_ci_lo_ms", "time_ci_hi_ms", "n_samples", "processes",
                "device_key", "speedup", "speedup_lo", "speedup_hi", "baseline")
#: A point's key within its run.
POINT_KEY = ("op", "case", "dtype", "backend", "env")

_TABLES = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, timestamp TEXT, added_at TEXT, source_file TEXT,
    envs TEXT, rows INTEGER, {", ".join(f"{c} TEXT" for c in RUN_FIELDS)}, env_ids TEXT);
CREATE TABLE IF NOT EXISTS parts (part TEXT PRIMARY KEY, run_id TEXT, rows INTEGER, added_at TEXT);
CREATE TABLE IF NOT EXISTS points (run_id TEXT, op TEXT, "case" TEXT, dtype TEXT, backend TEXT, env TEXT,
    status TEXT, source TEXT, time_ms REAL, time_ci_lo_ms REAL, time_ci_hi_ms REAL, n_samples INTEGER,
    processes INTEGER, device_key TEXT, speedup REAL, speedup_lo REAL, speedup_hi REAL, baseline TEXT,
    part TEXT, PRIMARY KEY (run_id, op, "case", dtype, backend, env));
"""
#: The index's SQL indexes (issue 46: an index keyed by device, environment/build, commit and plan).
_INDEXES = "".join(f"CREATE INDEX IF NOT EXISTS {t}_{c} ON {t} ({c});\n" for t, c in (
    ("runs", "device"), ("runs", "env_id"), ("runs", "flyexplore_commit"), ("runs", "plan"),
    ("points", "device_key")))


def default_store() -> Path:
    """The store used when none is given: ``$FLYEXPLORE_HISTORY``, else
    ``$XDG_DATA_HOME/flyexplore/history``, else ``~/.local/share/flyexplore/history`` (the XDG
    data folder: a history is kept, not a cache to make again)."""
    env = os.environ.get("FLYEXPLORE_HISTORY")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "flyexplore" / "history"


@dataclass
class Added:
    """What one :meth:`Store.add` did: per source, the runs it held, the rows added, the rows the
    store already had (``rows_known``) and how many of those with another ``time_ms`` than the
    stored one (``rows_other``: kept as stored); ``lines``: one text line per source, as
    ``flyexplore history add`` prints."""

    runs_added: int = 0
    rows_added: int = 0
    rows_known: int = 0
    lines: list[str] = field(default_factory=list)
    rows_other: int = 0


def _safe(text: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]", "_", text)[:80]
    return s or "run"


def _first(col: pd.Series):
    v = col.dropna()
    v = v[v.astype(str).str.len() > 0]
    return None if v.empty else str(v.iloc[0])


def _now() -> str:
    """The time now, UTC, as the rows' ``timestamp`` is written (ISO 8601, ``+00:00``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())


class Store:
    """A history store in the folder ``path`` (module docstring). Opening one reads nothing;
    :meth:`add` creates the folder, the others need it. Raises :class:`UsageError` (one line
    naming the folder) where ``path`` is a file, a folder holding other things but no
    ``history.sqlite`` (not a store), or a store whose index is damaged, foreign (no ``meta``
    of format :data:`FORMAT`) or of a newer layout."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else default_store()
        #: where the folder came from, when not given: said in the error of a missing store
        self._whence = "" if path is not None else (
            ", the default store ($FLYEXPLORE_HISTORY)" if os.environ.get("FLYEXPLORE_HISTORY")
            else ", the default store")
        if self.path.exists() and not self.path.is_dir():
            raise UsageError(f"history store {str(self.path)!r} is a file, not a folder")

    # -- opening -------------------------------------------------------------------------------
    @property
    def index(self) -> Path:
        """``history.sqlite`` of this store."""
        return self.path / INDEX

    def exists(self) -> bool:
        """Whether the folder holds a store (its ``history.sqlite``)."""
        return self.index.is_file()

    def _damaged(self, exc: Exception) -> UsageError:
        return UsageError(f"history store {str(self.path)!r} is damaged: {INDEX}: {exc}")

    def _check(self) -> None:
        """Check the existing index read-only (module docstring): raise :class:`UsageError` for a
        damaged or foreign one, or one of a newer layout."""
        uri = self.index.resolve().as_uri() + "?mode=ro"
        for attempt in (0, 1):
            try:
                con = sqlite3.connect(uri, uri=True, timeout=60)
                try:
                    has = con.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone()
                    meta = dict(con.execute("SELECT key, value FROM meta").fetchall()) if has else None
                finally:
                    con.close()
                break
            except sqlite3.OperationalError as exc:
                # a hot journal (a writer killed mid-transaction) cannot be rolled back read-only
                if attempt or not Path(str(self.index) + "-journal").exists():
                    raise self._damaged(exc) from None
                try:
                    con = sqlite3.connect(str(self.index), timeout=60)
                    try:   # SQLite rolls it back on a read-write connection's first read
                        con.execute("SELECT count(*) FROM sqlite_master").fetchone()
                    finally:
                        con.close()
                except sqlite3.DatabaseError as exc2:
                    raise self._damaged(exc2) from None
            except sqlite3.DatabaseError as exc:
                raise self._damaged(exc) from None
        where = repr(str(self.index))
        if meta is None or meta.get("format") != FORMAT:
            what = "no meta table" if meta is None else f"format {meta.get('format')!r}"
            raise UsageError(f"{where} is not a flyexplore history index ({what}, not {FORMAT!r}); give the "
                             "folder of a history store, or a new or empty folder")
        version = meta.get("version")
        if not re.fullmatch(r"[0-9]+", str(version)):
            raise UsageError(f"{where} has layout version {version!r}, not a whole number: damaged or not "
                             "written by flyexplore")
        if int(str(version)) > VERSION:
            raise UsageError(f"history store {str(self.path)!r} has layout version {version}, newer than this "
                             f"flyexplore reads ({VERSION}): upgrade flyexplore")

    def _connect(self, create: bool = False) -> sqlite3.Connection:
        """A read-write connection to the checked index (:meth:`_check`); ``create`` (an add,
        holding the lock): make a new index where there is none, and its SQL indexes."""
        if self.exists():
            self._check()
        elif not create:
            raise UsageError(f"no history store at {str(self.path)!r}{self._whence} (flyexplore history add "
                             "FILE... --store DIR makes one)")
        else:
            self._refuse_foreign()
            self._make_index()
        try:
            con = sqlite3.connect(str(self.index), timeout=60)
            if create:
                con.executescript(_INDEXES)   # no-ops where there (a store of an older flyexplore gets them)
                if "env_ids" not in {r[1] for r in con.execute("PRAGMA table_info(runs)")}:
                    con.execute("ALTER TABLE runs ADD COLUMN env_ids TEXT")
                    con.commit()
        except sqlite3.DatabaseError as exc:
            raise self._damaged(exc) from None
        return con

    def _make_index(self) -> None:
        """Make a new index whole under a temporary name and rename it into place (held lock)."""
        # a killed first add's temporary index, and journals of no index (SQLite would play a
        # stale one into the new file)
        for old in [*self.path.glob(f".{INDEX}.*"), *(self.path / (INDEX + s) for s in ("-journal", "-wal", "-shm"))]:
            atomic.discard(old)
        tmp = atomic.temp_for(self.index)
        try:
            con = sqlite3.connect(str(tmp))
            try:
                con.executescript(_TABLES + _INDEXES)
                con.execute("INSERT INTO meta VALUES ('format', ?), ('version', ?)", (FORMAT, str(VERSION)))
                con.commit()
            finally:
                con.close()
        except BaseException:
            atomic.discard(tmp)
            raise
        atomic.commit(tmp, self.index)

    def _refuse_foreign(self) -> None:
        """Raise :class:`UsageError` where the folder holds no index and names other than a
        store's own (:data:`OWN_NAMES`, ``.history.sqlite.*``: another add may be making the
        store right now); an add checks before it makes its lock file, and again holding it."""
        if self.exists() or not self.path.is_dir():
            return
        other = sorted(p.name for p in self.path.iterdir()
                       if p.name not in OWN_NAMES and not p.name.startswith(f".{INDEX}."))
        if other and not self.exists():
            raise UsageError(f"{str(self.path)!r} is not a flyexplore history store (it holds other files, e.g. "
                             f"{other[0]!r}, and no {INDEX}); give a new or empty folder")

    # -- adding --------------------------------------------------------------------------------
    def add(self, sources: Iterable[str | os.PathLike | pd.DataFrame], progress=None) -> Added:
        """Add result files (or DataFrames of result rows) to the store.

        Every source is read and checked first (:func:`flyexplore.results.table.load` with
        ``validated=True``; a DataFrame by :func:`~flyexplore.results.table.checked`): a damaged
        or foreign file, rows without a ``run_id``, or only published rows raise
        :class:`UsageError` (one line naming the file) and nothing is written; so does a
        damaged, foreign or newer index (checked read-only first: module docstring), or a
        folder with other files and no index. Then, holding the store's lock, the sources' runs are checked against the
        stored runs and each other: rows of a known ``run_id`` from another device
        (:func:`device_keys`), another ``env_id`` of an environment, or another ``plan`` raise
        :class:`UsageError` (naming the file, the run and what differs) and nothing is written.
        Then each run's rows that the store lacks (by run and key, :data:`POINT_KEY`) are
        written as one Parquet part and indexed in one transaction; rows it has are counted,
        not added (kept as stored, also where their ``time_ms`` differs: counted in
        ``rows_other``). ``progress``: called with each source's line. Returns :class:`Added`."""
        frames = []
        for src in sources:
            if isinstance(src, pd.DataFrame):
                name, df = "rows", R.checked(src, "rows")
            else:
                name, df = str(src), R.load(src, validated=True)
            # the A/B's environment order is in the sweep record (attrs); then the attrs go, or
            # pandas deep-copies them on every column read (half of an add's time)
            order = _env_order(df)
            df = df.copy(deep=False)
            df.attrs = {}
            frames.append((name, _runs_of(df, name), order))
        if not frames:
            raise UsageError("history add: no file given")
        from filelock import FileLock, Timeout

        self._same_runs(None, frames)   # the sources among themselves, before anything is made
        if self.exists():
            self._check()
        else:
            self._refuse_foreign()
        self.path.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(self.path / LOCK), timeout=LOCK_TIMEOUT_S)
        try:
            lock.acquire()
        except Timeout:
            raise UsageError(f"history store {str(self.path)!r} is locked by another add for over "
                             f"{LOCK_TIMEOUT_S:.0f} s ({self.path / LOCK})") from None
        out = Added()
        try:
            con = self._connect(create=True)
            try:
                self._same_runs(con, frames)
                for name, runs, order in frames:
                    line = self._add_source(con, name, runs, order, out)
                    out.lines.append(line)
                    if progress is not None:
                        progress(line)
            except sqlite3.DatabaseError as exc:
                raise self._damaged(exc) from None
            finally:
                con.close()
        finally:
            lock.release()
        return out

    def _same_runs(self, con: sqlite3.Connection | None, frames: list) -> None:
        """Raise :class:`UsageError` where a source's run is a stored run (``con``) or an earlier
        source's of another device, ``env_id`` or plan (:func:`_identity`)."""
        seen: dict[str, tuple[dict | None, str]] = {}
        for name, runs, _ in frames:
            for run_id, rows in runs:
                new = _identity(rows)
                if run_id not in seen and con is not None:
                    seen[run_id] = (_stored_identity(con, run_id), f"history store {str(self.path)!r}")
                old, where = seen.get(run_id, (None, ""))
                diff = _difference(new, old) if old is not None else ""
                if diff:
                    raise UsageError(f"{name}: run {run_id} is in {where} from another device, build or plan "
                                     f"({diff}); a run_id names one sweep (nothing added)")
                seen[run_id] = (_merged(old, new), where if old is not None else f"{name}, added before it")

    def _add_source(self, con: sqlite3.Connection, name: str, runs: list[tuple[str, pd.DataFrame]],
                    order: list[str] | None, out: Added) -> str:
        added = known = other = new_runs = 0
        for run_id, rows in runs:
            have = {tuple(r[:5]): r[5] for r in con.execute(
                'SELECT op, "case", dtype, backend, env, time_ms FROM points WHERE run_id = ?', (run_id,))}
            keys = [tuple(k) for k in _keys(rows).itertuples(index=False, name=None)]
            new = np.fromiter((k not in have for k in keys), dtype=bool, count=len(keys))
            known += int((~new).sum())
            times = _floats(rows["time_ms"]) if "time_ms" in rows else [None] * len(keys)
            other += sum(1 for k, n, t in zip(keys, new, times) if not n and have[k] != t)
            if not new.any():
                continue
            part_rows = rows[new].reset_index(drop=True)
            digest = hashlib.blake2b("\x1e".join([run_id, *("\x1f".join(k) for k, n in zip(keys, new) if n)]).encode(),
                                     digest_size=8).hexdigest()
            part = f"{_safe(run_id)}.{digest}.parquet"
            R.save(part_rows, self.path / PARTS / part)
            now = _now()
            stored = con.execute("SELECT env_ids FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            env_ids = json.dumps(_envs_json(_merged(_stored_identity(con, run_id) if stored else None,
                                                    _identity(part_rows))))
            first = _first(part_rows["timestamp"].sort_values()) if "timestamp" in part_rows else None
            with con:   # one transaction: the part, its points and the run, or none of them
                if stored is None:
                    info = _run_info(rows, order)
                    con.execute(f"INSERT INTO runs (run_id, timestamp, added_at, source_file, envs, rows, env_ids, "
                                f"{', '.join(RUN_FIELDS)}) VALUES ({', '.join('?' * (7 + len(RUN_FIELDS)))})",
                                (run_id, info.pop("timestamp") or now, now, name, info.pop("envs"), 0, env_ids,
                                 *[info[c] for c in RUN_FIELDS]))
                else:
                    con.execute("UPDATE runs SET env_ids = ? WHERE run_id = ?", (env_ids, run_id))
                    if first is not None:
                        con.execute("UPDATE runs SET timestamp = min(coalesce(timestamp, added_at), ?) "
                                    "WHERE run_id = ?", (first, run_id))
                con.execute("UPDATE runs SET rows = rows + ? WHERE run_id = ?", (int(new.sum()), run_id))
                con.execute("INSERT INTO parts VALUES (?, ?, ?, ?)", (part, run_id, int(new.sum()), now))
                con.executemany(f'INSERT INTO points VALUES ({", ".join("?" * 19)})',
                                _point_tuples(part_rows, run_id, part))
            added += int(new.sum())
            new_runs += int(stored is None)
        out.runs_added += new_runs
        out.rows_added += added
        out.rows_known += known
        out.rows_other += other
        kept = f", {other} of them with other values, kept as stored" if other else ""
        n_runs = f"{len(runs)} run{'s' * (len(runs) != 1)}"
        if not added:
            return f"{name}: already in the store ({known} rows of {n_runs}{kept})"
        tail = f"; {known} rows it had already{kept}" if known else ""
        return f"{name}: {added} rows of {n_runs} added ({new_runs} new run{'s' * (new_runs != 1)}){tail}"

    def check_outside(self, path: str | os.PathLike, what: str) -> None:
        """Refuse an output ``path`` inside the store's folder (it would replace the index or a
        part): :class:`UsageError` naming ``what`` (``--out``, ``export file``, ...) and the path."""
        p, root = Path(path).resolve(), self.path.resolve()
        if p == root or root in p.parents:
            raise UsageError(f"bad {what} {str(path)!r}: inside the history store {str(self.path)!r}; "
                             "write it elsewhere")

    # -- reading -------------------------------------------------------------------------------
    def runs(self) -> pd.DataFrame:
        """The store's runs (the index's ``runs`` table), oldest first (by ``timestamp``, which
        every run has, then ``run_id``). Raises :class:`UsageError` when there is no store or it
        is damaged."""
        con = self._connect()
        try:
            # coalesce: a store made before every run had a timestamp orders its runs alike too
            return pd.read_sql_query("SELECT * FROM runs ORDER BY coalesce(timestamp, added_at), run_id", con)
        except sqlite3.DatabaseError as exc:
            raise self._damaged(exc) from None
        finally:
            con.close()

    def points(self, device: str | None = None) -> pd.DataFrame:
        """Every indexed row (``points``) with its run's fields (:data:`RUN_FIELDS` prefixed
        ``run_``: ``run_device``, ``run_platform``, ...; ``timestamp``, ``envs``), oldest run
        first; only runs of ``device`` (a device name, or a device key: a ``device_id``) when given. Times in ms.
        Raises :class:`UsageError` when there is no store or it is damaged."""
        con = self._connect()
        cols = ", ".join(f"r.{c} AS run_{c}" for c in RUN_FIELDS)
        q = (f"SELECT p.*, coalesce(r.timestamp, r.added_at) AS timestamp, r.envs AS envs, {cols} "
             "FROM points p JOIN runs r USING (run_id)")
        args: tuple = ()
        if device:
            q += " WHERE r.device = ? OR p.device_key = ?"
            args = (device, device)
        q += " ORDER BY coalesce(r.timestamp, r.added_at), p.run_id"
        try:
            return pd.read_sql_query(q, con, params=args)
        except sqlite3.DatabaseError as exc:
            raise self._damaged(exc) from None
        finally:
            con.close()

    def rows(self, run_ids: Sequence[str] | None = None) -> pd.DataFrame:
        """The stored result rows, whole (samples and all), of ``run_ids`` (default: every run),
        read from the Parquet parts the index names (a part it does not name is ignored). Raises
        :class:`UsageError` naming a part that is missing or damaged."""
        con = self._connect()
        try:
            parts = con.execute("SELECT part, run_id FROM parts").fetchall()
        except sqlite3.DatabaseError as exc:
            raise self._damaged(exc) from None
        finally:
            con.close()
        want = None if run_ids is None else set(run_ids)
        frames = [R.load(self.path / PARTS / p) for p, r in parts if want is None or r in want]
        return R.concat(frames) if frames else R.empty_frame()


def _texts(rows: pd.DataFrame, col: str) -> pd.Series:
    """``rows[col]`` as text, '' where empty or missing."""
    if col not in rows:
        return pd.Series([""] * len(rows), index=rows.index, dtype=str)
    return rows[col].astype("string").fillna("").astype(str)


def _keys(rows: pd.DataFrame) -> pd.DataFrame:
    """The point key of every row (:data:`POINT_KEY`), as text ('' where empty)."""
    return pd.DataFrame({c: _texts(rows, c).to_numpy() for c in POINT_KEY})


def _floats(col: pd.Series) -> list:
    """A numeric column as floats, None where empty or not finite (as the index stores them)."""
    v = pd.to_numeric(col, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    return [float(x) if np.isfinite(x) else None for x in v]


def _identity(rows: pd.DataFrame) -> dict:
    """What one run's rows say it is: their device keys (:func:`device_keys`), plans, and each
    environment's ``env_id`` (environment '' for rows of no A/B); empty values left out."""
    env, env_id = _texts(rows, "env"), _texts(rows, "env_id")
    return {"device": set(device_keys(rows)), "plan": set(_texts(rows, "plan")) - {""},
            "env_id": {e: set(g) - {""} for e, g in env_id.groupby(env.to_numpy(), sort=False)}}


def _stored_identity(con: sqlite3.Connection, run_id: str) -> dict | None:
    """:func:`_identity` of a stored run (its points' ``device_key``, ``runs.plan`` and
    ``runs.env_ids``), None when the store lacks the run."""
    row = con.execute("SELECT plan, env_ids FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    if row is None:
        return None
    dev = {d for (d,) in con.execute("SELECT DISTINCT device_key FROM points WHERE run_id = ?", (run_id,))}
    envs = json.loads(row[1]) if row[1] else None   # None: a store of an older flyexplore, not known
    return {"device": dev, "plan": {row[0]} if row[0] else set(),
            "env_id": None if envs is None else {e: set(v) for e, v in envs.items()}}


def _difference(new: dict, old: dict) -> str:
    """What ``new`` (:func:`_identity`) says that the stored ``old`` does not: '' when none (an
    environment the stored run lacks is no difference: a later add of an A/B may bring it)."""
    def one(what: str, a: set, b: set) -> list[str]:
        extra = sorted(a - b)
        return [f"{what} {', '.join(extra)}, the store's {', '.join(sorted(b)) or 'none'}"] if extra else []
    out = one("device", new["device"], old["device"]) + one("plan", new["plan"], old["plan"])
    for e, ids in new["env_id"].items():
        if old["env_id"] is not None and e in old["env_id"]:
            out += one(f"env_id{f' of env {e}' if e else ''}", ids, old["env_id"][e])
    return "; ".join(out)


def _merged(old: dict | None, new: dict) -> dict:
    """``old`` and ``new`` (:func:`_identity`) together."""
    if old is None:
        return {"device": set(new["device"]), "plan": set(new["plan"]),
                "env_id": {e: set(v) for e, v in new["env_id"].items()}}
    env = {e: set(v) for e, v in (old["env_id"] or {}).items()}
    for e, v in new["env_id"].items():
        env[e] = env.get(e, set()) | v
    return {"device": old["device"] | new["device"], "plan": old["plan"] | new["plan"], "env_id": env}


def _envs_json(ident: dict) -> dict:
    return {e: sorted(v) for e, v in sorted(ident["env_id"].items())}


def _runs_of(df: pd.DataFrame, name: str) -> list[tuple[str, pd.DataFrame]]:
    """The measured rows of a checked result set, by ``run_id``. Raises :class:`UsageError` for
    rows without one or a set of published rows only."""
    if "source" in df:
        df = df[df["source"].astype("string").fillna("measured") != "published"]
    if df.empty:
        raise UsageError(f"{name} has no measured rows (published figures are no run; nothing added)")
    if "run_id" not in df or df["run_id"].isna().any() or (df["run_id"].astype(str).str.len() == 0).any():
        raise UsageError(f"{name} has rows without a run_id: not a sweep's result file (nothing added)")
    dup = _keys(df).assign(run_id=df["run_id"].astype(str).to_numpy()).duplicated()
    if dup.any():
        i = int(np.flatnonzero(dup.to_numpy())[0])
        r = df.iloc[i]
        raise UsageError(f"{name} holds the row {r['op']} {r['case']} {r['dtype']} {r['backend']} of run "
                         f"{r['run_id']} twice (nothing added)")
    return [(str(k), g.reset_index(drop=True)) for k, g in df.groupby(df["run_id"].astype(str), sort=False)]


def _env_order(df: pd.DataFrame) -> list[str] | None:
    """An A/B's environments in the run's order (:func:`flyexplore.results.series.run_order`), None
    for rows of no A/B."""
    if "env" not in df or not df["env"].notna().any():
        return None
    return run_order(df)


def _run_info(rows: pd.DataFrame, order: list[str] | None) -> dict:
    """A new run's fields (:data:`RUN_FIELDS`), ``timestamp`` (its rows' earliest, None where they
    have none) and ``envs`` (the A/B's environments in order, JSON)."""
    info = {c: (_first(rows[c]) if c in rows else None) for c in RUN_FIELDS}
    if "device_id" in rows:
        ids = sorted({str(v) for v in rows["device_id"].dropna() if str(v)})
        info["device_id"] = ",".join(ids) or None
    info["timestamp"] = _first(rows["timestamp"].sort_values()) if "timestamp" in rows else None
    have = set(rows["env"].dropna().astype(str)) if "env" in rows else set()
    envs = [e for e in order or [] if e in have]
    info["envs"] = json.dumps(envs) if envs else None
    return info


def device_keys(rows: pd.DataFrame) -> pd.Series:
    """The physical device of each row: its ``device_id`` (a GPU's UUID or PCI bus id), else --
    a CPU, whose rows have none -- ``host/device`` (``vm/AMD EPYC``). Text, one per row."""
    host = rows["host"].astype("string").fillna("?") if "host" in rows else pd.Series("?", index=rows.index)
    dev = rows["device"].astype("string").fillna("?") if "device" in rows else pd.Series("?", index=rows.index)
    fallback = host + "/" + dev
    if "device_id" not in rows:
        return fallback.astype(str)
    ids = rows["device_id"].astype("string")
    return ids.where(ids.notna() & (ids.str.len() > 0), fallback).astype(str)


def _point_tuples(rows: pd.DataFrame, run_id: str, part: str) -> list[tuple]:
    keys = _keys(rows)
    rows = rows.assign(device_key=device_keys(rows))
    cols = []
    for c in POINT_FIELDS:
        if c not in rows:
            cols.append([None] * len(rows))
        elif c in ("status", "source", "device_key", "baseline"):
            cols.append([None if pd.isna(v) else str(v) for v in rows[c].tolist()])
        elif c in ("n_samples", "processes"):
            cols.append([None if pd.isna(v) else int(v) for v in rows[c].tolist()])
        else:
            cols.append(_floats(rows[c]))
    return [(run_id, *k, *vals, part) for k, vals in zip(keys.itertuples(index=False, name=None), zip(*cols))]


def base_backend(backend: str) -> str:
    """The backend of an arm (``aten@0.13b`` -> ``aten``; :func:`flyexplore.results.arms.split_arm`)."""
    return split_arm(backend)[0]
