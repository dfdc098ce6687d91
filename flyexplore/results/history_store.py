"""The history store: every run added to it, kept for good (``flyexplore history add``,
``fx.history``). What is read from it -- trends, steps, the learned allowance, the exports -- is
:mod:`flyexplore.results.history`.

A store is a folder:

- ``runs/<run_id>.<digest>.parquet``: the rows one add brought of one run (a sweep's
  ``run_id``), whole, as :func:`flyexplore.results.table.save` writes them (samples and all);
  never rewritten. A resumed sweep's later add brings only the cases the store lacks, in a part
  of its own.
- ``history.sqlite`` (SQLite, :mod:`sqlite3`): the index, in one transaction per add --
  ``runs`` (one row per run: device, platform, arch, environment/build ``env_id`` and the A/B's
  environments, versions, ``flyexplore_commit``, ``plan``, first timestamp), ``points`` (one
  row per result row: the key ``op, case, dtype, backend, env``, ``status``, ``time_ms``, its
  95% interval, ``device_key``: :func:`device_keys`) and ``parts`` (the Parquet files). Reading trends reads only this
  file: 1,000 runs x 100 cases in well under a second.
- ``.add.lock``: :class:`filelock.FileLock`, held by an add (two adds at once run one after the
  other).

Safety, by construction: a part is written whole under a temporary name and renamed
(:mod:`flyexplore.atomic`) before the index names it; the index changes in one SQLite
transaction. A ``kill -9`` before the commit leaves at most a part the index does not name,
which readers ignore and the next add of that run writes again under the same name; after it,
the add is whole. A row the store already has (same run and key) is never added twice, so adding
a file twice changes nothing. A file that is not a whole result file is refused before anything
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

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, timestamp TEXT, added_at TEXT, source_file TEXT,
    envs TEXT, rows INTEGER, {", ".join(f"{c} TEXT" for c in RUN_FIELDS)});
CREATE TABLE IF NOT EXISTS parts (part TEXT PRIMARY KEY, run_id TEXT, rows INTEGER, added_at TEXT);
CREATE TABLE IF NOT EXISTS points (run_id TEXT, op TEXT, "case" TEXT, dtype TEXT, backend TEXT, env TEXT,
    status TEXT, source TEXT, time_ms REAL, time_ci_lo_ms REAL, time_ci_hi_ms REAL, n_samples INTEGER,
    processes INTEGER, device_key TEXT, speedup REAL, speedup_lo REAL, speedup_hi REAL, baseline TEXT,
    part TEXT, PRIMARY KEY (run_id, op, "case", dtype, backend, env));
"""


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
    """What one :meth:`Store.add` did: per source, the runs it held, the rows added and the rows the
    store already had (``lines``: one text line per source, as ``flyexplore history add`` prints)."""

    runs_added: int = 0
    rows_added: int = 0
    rows_known: int = 0
    lines: list[str] = field(default_factory=list)


def _safe(text: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]", "_", text)[:80]
    return s or "run"


def _first(col: pd.Series):
    v = col.dropna()
    v = v[v.astype(str).str.len() > 0]
    return None if v.empty else str(v.iloc[0])


class Store:
    """A history store in the folder ``path`` (module docstring). Opening one reads nothing;
    :meth:`add` creates the folder, the others need it. Raises :class:`UsageError` (one line
    naming the folder) where ``path`` is a file, a folder holding other things but no
    ``history.sqlite`` (not a store), or a store whose index is damaged or of a newer layout."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else default_store()
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

    def _connect(self, create: bool = False) -> sqlite3.Connection:
        name = repr(str(self.path))
        if not self.exists():
            if not create:
                raise UsageError(f"no history store at {name} (flyexplore history add FILE... --store DIR makes one)")
            self._refuse_foreign()
        try:
            con = sqlite3.connect(str(self.index), timeout=60)
            if create:
                con.executescript(_SCHEMA)
                con.execute("INSERT OR IGNORE INTO meta VALUES ('format', ?), ('version', ?)", (FORMAT, str(VERSION)))
                con.commit()
            meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.DatabaseError as exc:
            raise UsageError(f"history store {name} is damaged: {INDEX}: {exc}") from None
        if meta.get("format") != FORMAT:
            con.close()
            raise UsageError(f"{str(self.index)!r} is not a flyexplore history index (format {meta.get('format')!r})")
        if int(meta.get("version", 0)) > VERSION:
            con.close()
            raise UsageError(f"history store {name} has layout version {meta.get('version')}, newer than this "
                             f"flyexplore reads ({VERSION}): upgrade flyexplore")
        return con

    def _refuse_foreign(self) -> None:
        """Raise :class:`UsageError` where the folder holds other files and no index (before an add
        makes its lock file there: a refused add leaves the folder as it was)."""
        if not self.exists() and self.path.exists() and any(p.name not in (LOCK, PARTS) for p in self.path.iterdir()):
            raise UsageError(f"{str(self.path)!r} is not a flyexplore history store (it holds other files and no "
                             f"{INDEX}); give a new or empty folder")

    # -- adding --------------------------------------------------------------------------------
    def add(self, sources: Iterable[str | os.PathLike | pd.DataFrame], progress=None) -> Added:
        """Add result files (or DataFrames of result rows) to the store.

        Every source is read and checked first (:func:`flyexplore.results.table.load` with
        ``validated=True``; a DataFrame by :func:`~flyexplore.results.table.checked`): a damaged
        or foreign file, rows without a ``run_id``, or only published rows raise
        :class:`UsageError` (one line naming the file) and nothing is written. Then, holding
        the store's lock, each run's rows that the store lacks (by run and key, :data:`POINT_KEY`)
        are written as one Parquet part and indexed in one transaction; rows it has are counted,
        not added. ``progress``: called with each source's line. Returns :class:`Added`."""
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
                for name, runs, order in frames:
                    line = self._add_source(con, name, runs, order, out)
                    out.lines.append(line)
                    if progress is not None:
                        progress(line)
            finally:
                con.close()
        finally:
            lock.release()
        return out

    def _add_source(self, con: sqlite3.Connection, name: str, runs: list[tuple[str, pd.DataFrame]],
                    order: list[str] | None, out: Added) -> str:
        added = known = new_runs = 0
        for run_id, rows in runs:
            have = {tuple(r) for r in con.execute(
                'SELECT op, "case", dtype, backend, env FROM points WHERE run_id = ?', (run_id,)).fetchall()}
            keys = [tuple(k) for k in _keys(rows).itertuples(index=False, name=None)]
            new = np.fromiter((k not in have for k in keys), dtype=bool, count=len(keys))
            known += int((~new).sum())
            if not new.any():
                continue
            part_rows = rows[new].reset_index(drop=True)
            digest = hashlib.blake2b("\n".join("\x1f".join(k) for k, n in zip(keys, new) if n).encode(),
                                     digest_size=6).hexdigest()
            part = f"{_safe(run_id)}.{digest}.parquet"
            R.save(part_rows, self.path / PARTS / part)
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            is_new = con.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is None
            with con:   # one transaction: the part, its points and the run, or none of them
                if is_new:
                    info = _run_info(rows, order)
                    con.execute(f"INSERT INTO runs (run_id, timestamp, added_at, source_file, envs, rows, "
                                f"{', '.join(RUN_FIELDS)}) VALUES ({', '.join('?' * (6 + len(RUN_FIELDS)))})",
                                (run_id, info.pop("timestamp"), now, name, info.pop("envs"), 0,
                                 *[info[c] for c in RUN_FIELDS]))
                con.execute("UPDATE runs SET rows = rows + ? WHERE run_id = ?", (int(new.sum()), run_id))
                con.execute("INSERT OR REPLACE INTO parts VALUES (?, ?, ?, ?)", (part, run_id, int(new.sum()), now))
                con.executemany(f'INSERT INTO points VALUES ({", ".join("?" * 19)})', _point_tuples(part_rows, run_id, part))
            added += int(new.sum())
            new_runs += int(is_new)
        out.runs_added += new_runs
        out.rows_added += added
        out.rows_known += known
        if not added:
            return f"{name}: already in the store ({known} rows of {len(runs)} run{'s' * (len(runs) != 1)})"
        tail = f"; {known} rows it had already" if known else ""
        return (f"{name}: {added} rows of {len(runs)} run{'s' * (len(runs) != 1)} added "
                f"({new_runs} new run{'s' * (new_runs != 1)}){tail}")

    # -- reading -------------------------------------------------------------------------------
    def runs(self) -> pd.DataFrame:
        """The store's runs (the index's ``runs`` table), oldest first (by first timestamp, then
        ``run_id``). Raises :class:`UsageError` when there is no store or it is damaged."""
        con = self._connect()
        try:
            return pd.read_sql_query("SELECT * FROM runs ORDER BY timestamp, run_id", con)
        except sqlite3.DatabaseError as exc:
            raise UsageError(f"history store {str(self.path)!r} is damaged: {INDEX}: {exc}") from None
        finally:
            con.close()

    def points(self, device: str | None = None) -> pd.DataFrame:
        """Every indexed row (``points``) with its run's fields (:data:`RUN_FIELDS` prefixed
        ``run_``: ``run_device``, ``run_platform``, ...; ``timestamp``, ``envs``), oldest run
        first; only runs of ``device`` (a device name, or a device key: a ``device_id``) when given. Times in ms.
        Raises :class:`UsageError` when there is no store or it is damaged."""
        con = self._connect()
        cols = ", ".join(f"r.{c} AS run_{c}" for c in RUN_FIELDS)
        q = f"SELECT p.*, r.timestamp AS timestamp, r.envs AS envs, {cols} FROM points p JOIN runs r USING (run_id)"
        args: tuple = ()
        if device:
            q += " WHERE r.device = ? OR p.device_key = ?"
            args = (device, device)
        q += " ORDER BY r.timestamp, p.run_id"
        try:
            return pd.read_sql_query(q, con, params=args)
        except sqlite3.DatabaseError as exc:
            raise UsageError(f"history store {str(self.path)!r} is damaged: {INDEX}: {exc}") from None
        finally:
            con.close()

    def rows(self, run_ids: Sequence[str] | None = None) -> pd.DataFrame:
        """The stored result rows, whole (samples and all), of ``run_ids`` (default: every run),
        read from the Parquet parts the index names. Raises :class:`UsageError` naming a part
        that is missing or damaged."""
        con = self._connect()
        try:
            q = "SELECT part, run_id FROM parts"
            parts = con.execute(q).fetchall()
        finally:
            con.close()
        want = None if run_ids is None else set(run_ids)
        frames = [R.load(self.path / PARTS / p) for p, r in parts if want is None or r in want]
        return R.concat(frames) if frames else R.empty_frame()


def _keys(rows: pd.DataFrame) -> pd.DataFrame:
    """The point key of every row (:data:`POINT_KEY`), as text ('' where empty)."""
    return pd.DataFrame({c: (rows[c].astype("string").fillna("") if c in rows else pd.Series([""] * len(rows)))
                         for c in POINT_KEY}).astype(str)


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
            v = pd.to_numeric(rows[c], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
            cols.append([None if not np.isfinite(x) else float(x) for x in v])
    return [(run_id, *k, *vals, part) for k, vals in zip(keys.itertuples(index=False, name=None), zip(*cols))]


def base_backend(backend: str) -> str:
    """The backend of an arm (``aten@0.13b`` -> ``aten``; :func:`flyexplore.results.arms.split_arm`)."""
    return split_arm(backend)[0]
