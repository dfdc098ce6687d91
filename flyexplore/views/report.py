"""Reports: one self-contained HTML file (environment, tables, figures) that opens offline,
plus the figures as PNG/SVG/PDF and the tables as CSV/Markdown/LaTeX beside it.

- :func:`write_report`: one or more result sets (``flyexplore report``, ``flyexplore demo``).
- :func:`write_compare_report`: an A/B of two result sets paired by case (``flyexplore compare``).
- :func:`write_vllm_report`: an A/B of two arms of ``vllm bench serve --save-result`` files.

Layout of ``out_dir``: ``report.html`` (it loads plotly.js from ``plotly.min.js`` beside it, so
the folder opens offline and the page stays small), ``figures/<name>.{png,svg,pdf}``
(when static export works here; see :mod:`flyexplore.views.export`), ``tables/<name>.{csv,md,tex}``,
and ``.flyexplore-report.json`` listing them. A report goes only into a new or empty folder or
one holding an earlier report, which it replaces whole (:func:`check_report_dir`).
Figures never change the data; every number in a report comes from the result rows given.
"""
from __future__ import annotations

import datetime as _dt
import html
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from flyexplore import atomic as A
from flyexplore._version import __version__
from flyexplore.errors import UsageError
from flyexplore.measure import stats as S
from flyexplore.results import model as RM
from flyexplore.results import peaks as K
from flyexplore.results import table as R
from flyexplore.results import vllm as V
from flyexplore.results.compare import SYNTHETIC_LINE, Sides, is_synthetic, pair
from flyexplore.results.published import headlines, load, ranges, vllm_published
from flyexplore.views import plot_style as P
from flyexplore.views import plots as F
from flyexplore.views import plots_compare as FC
from flyexplore.views import export as E
from flyexplore.views.aotriton import report_section
from flyexplore.views.series import series_section
from flyexplore.views.export import (
    IMAGE_FORMATS,
    check_writable,
    save_figures,
    save_tables,
)
from flyexplore.views.plots import case_params
from flyexplore.views.tables import (
    PAGE_ROWS,
    PAGER_CSS,
    fmt_nums,
    paged_table,
    pager_script,
    scan_table,
    static_table,
    text_frame,
)

_TABLE_COLS = ["op", "case", "dtype", "backend", "status", "time_ms", "per_call_ms", "timing_mode", "order",
               "rounds", "converged", "tflops", "gbps", "err_rel", "accuracy_ok", "recheck_ok", "noisy",
               "host_bound", "clock_mhz_min", "throttled", "source", "observed", "flydsl_taken", "device",
               "message"]
_ENV_COLS = ["env", "platform", "device", "arch", "torch", "triton", "flydsl", "aotriton", "gpu_runtime",
             "blas_library", "tunableop", "python", "env_python", "env_changes", "host", "env_id", "flyexplore_commit"]
_CSS = ("body{font-family:Arial,Helvetica,sans-serif;margin:2em;max-width:1500px;color:#222}"
        "table{border-collapse:collapse;font-size:12px;margin:0.5em 0 1.5em}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}th{background:#f3f3f3}"
        ".note{background:#fff7e0;border-left:4px solid #e0a800;padding:6px 10px}"
        ".diff{background:#ffe8e8}pre{background:#f7f7f7;padding:8px;overflow-x:auto}"
        "h2{border-bottom:1px solid #ddd;padding-bottom:3px;margin-top:1.6em}")


def summary_table(df: pd.DataFrame) -> pd.DataFrame:
    """The rows a report shows: key, status, time in µs (headline, its 95% interval, per
    call), the speedup against the case's baseline as ``est [lo, hi] vs baseline`` with its
    verdict, rounds and convergence, TFLOP/s, GB/s, error, flags, clock, source, device and
    message. One row per row of ``df`` (same order); vectorized (no per-row Python loop)."""
    t = df[[c for c in _TABLE_COLS if c in df]].copy()
    t["time_us"] = t.pop("time_ms") * 1e3
    na = pd.Series(np.nan, index=df.index)
    lo = pd.to_numeric(df.get("time_ci_lo_ms", na), errors="coerce").to_numpy(dtype=float, na_value=np.nan) * 1e3
    hi = pd.to_numeric(df.get("time_ci_hi_ms", na), errors="coerce").to_numpy(dtype=float, na_value=np.nan) * 1e3
    ci = np.full(len(df), "", dtype=object)
    ok = ~(np.isnan(lo) | np.isnan(hi))
    if ok.any():
        ci[ok] = "[" + fmt_nums(lo[ok]) + ", " + fmt_nums(hi[ok]) + "]"
    t["time_ci_us"] = ci
    t["per_call_us"] = t.pop("per_call_ms") * 1e3
    t.insert(t.columns.get_loc("status") + 1, "speedup", _speedup_text(df))
    t.insert(t.columns.get_loc("speedup") + 1, "verdict", df["verdict"] if "verdict" in df else pd.NA)
    front = [c for c in t.columns if c not in ("time_us", "time_ci_us")]
    i = front.index("verdict") + 1
    return t[front[:i] + ["time_us", "time_ci_us"] + front[i:]]


def _floats(df: pd.DataFrame, col: str) -> np.ndarray:
    if col not in df:
        return np.full(len(df), np.nan)
    return pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def _speedup_text(df: pd.DataFrame) -> np.ndarray:
    """``"1.103x [1.098, 1.109] vs aten"`` per row (:func:`flyexplore.measure.stats.fmt_interval`
    without the label, then the baseline); ``""`` where the row has no speedup."""
    out = np.full(len(df), "", dtype=object)
    if "speedup" not in df or not len(df):
        return out
    est, lo, hi = (_floats(df, c) for c in ("speedup", "speedup_lo", "speedup_hi"))
    base = df["baseline"].astype(object).map(str).to_numpy(dtype=object) if "baseline" in df else None
    for k in np.flatnonzero(~np.isnan(est)).tolist():   # the rows with a speedup: one rule, stats'
        out[k] = f"{S.fmt_interval(est[k], lo[k], hi[k])} vs {base[k] if base is not None else None}"
    return out


def verdict_sentence(labels: pd.Series, faster: str = "faster", than: str = "the baseline",
                     env_ab: bool = False) -> str:
    """One plain sentence on what a set of labels says: which differences are real (FASTER,
    SLOWER: the 95% interval lies outside +-1%), which are none (SAME: inside), and which are
    noise at this precision (AMBIGUOUS). ``faster`` names the FASTER side's word, ``than`` the
    baseline; ``env_ab``: the labels are an environment A/B's (what narrows them is more pairs
    of workers, ``--pairs``, not ``--processes``)."""
    lab = labels.dropna()
    if lab.empty:
        return "No interval: these numbers carry no verdict."
    n = {k: int((lab == k).sum()) for k in S.LABELS}
    parts = []
    if n["FASTER"] or n["SLOWER"]:
        parts.append(f"{n['FASTER'] + n['SLOWER']} real difference(s): {n['FASTER']} {faster}, "
                     f"{n['SLOWER']} slower than {than} (the 95% interval lies outside ±1%)")
    if n["SAME"]:
        parts.append(f"{n['SAME']} no difference (SAME: the interval lies within ±1%)")
    if n["AMBIGUOUS"] and env_ab:
        parts.append(f"{n['AMBIGUOUS']} cannot be told apart from noise at ±1% (AMBIGUOUS: the interval "
                     "crosses a band edge; in an environment A/B its width is the spread between the pairs "
                     "of workers: more --pairs narrow it, or read it at a wider --band)")
    elif n["AMBIGUOUS"]:
        parts.append(f"{n['AMBIGUOUS']} cannot be told apart from noise at ±1% (AMBIGUOUS: the interval "
                     "crosses a band edge; within one run more rounds may decide, across runs the "
                     "run-to-run allowance sets the width: sweep --processes measures it)")
    return "Of " + str(len(lab)) + " comparisons: " + "; ".join(parts) + "."


#: Up to this many comparisons :func:`verdict_lines` gives one line each; past it, one line per
#: (op, dtype, backend) with the geometric mean and the count of each label.
VERDICT_LINES = 40


def verdict_lines(df: pd.DataFrame, baseline: str | Sequence[str] | None = None,
                  limit: int = VERDICT_LINES) -> list[str]:
    """The verdicts of a result set in a few plain-text lines, what ``flyexplore demo`` prints
    before the report's path: a heading saying what the numbers are, then one line per
    comparison (``  gemm 128x128x128 fp32 inductor vs aten  0.812x [0.790, 0.830] SLOWER``:
    op, case, dtype, backend vs its baseline, the speedup with its 95% interval and label; the
    device too where the rows hold several), the numbers in one column; past ``limit``
    comparisons one line per (op, dtype, backend) instead (its geometric mean, interval and
    label, and how many cases got each label); last, how many rows did not run. ``baseline``
    None: :func:`flyexplore.results.table.default_baseline`. Empty when nothing has a speedup."""
    if df is None or df.empty:
        return []
    if baseline is None:
        baseline = R.default_baseline(df)
    bname = P.baseline_name(baseline)
    devs = df["device"].astype(object).where(df["device"].notna(), "unknown device") if "device" in df else None
    several = devs is not None and devs.nunique() > 1
    items: list[tuple[str, str]] = []
    n_cmp = 0
    groups = df.groupby(devs, sort=False) if several else [(None, df)]
    sps = []
    for dev, d in groups:
        try:
            sp = R.speedup(d, baseline)
        except UsageError:
            continue
        sps.append((dev, d, sp))
        n_cmp += len(sp)
    for dev, d, sp in sps:
        on = f" on {dev}" if several else ""
        if n_cmp <= limit:
            for r in sp.itertuples():
                lab = None if pd.isna(r.verdict) else str(r.verdict)
                items.append((f"{r.op} {r.case} {r.dtype} {r.backend} vs {r.baseline}{on}",
                              S.fmt_interval(r.speedup, r.speedup_lo, r.speedup_hi, lab)))
        else:
            for r in R.geomean_speedup(d, baseline).itertuples():
                lab = None if pd.isna(r.verdict) else str(r.verdict)
                counts = ", ".join(f"{getattr(r, k)} {k}" for k in S.LABELS if getattr(r, k))
                items.append((f"{r.op} {r.dtype} {r.backend} vs {bname}{on}, geomean of {r.cases} cases",
                              S.fmt_interval(r.geomean, r.geomean_lo, r.geomean_hi, lab)
                              + (f" ({counts})" if counts else "")))
    if not items:
        return []
    head = f"verdicts: speedup = {bname} time / backend time, [95% interval], label (SAME: within ±{S.BAND:.0%})"
    if n_cmp > limit:
        head += f"; {n_cmp} comparisons, per backend here, per case in the report"
    col = max(len(c) for c, _ in items)
    out = [head] + [f"  {c:<{col}}  {v}" for c, v in items]
    bad = df[~df["status"].isin(["ok", "published"])] if "status" in df else df.iloc[0:0]
    if len(bad):
        what = ", ".join(f"{be} {st} ({len(g)})" for (be, st), g in bad.groupby(["backend", "status"], sort=False))
        out.append(f"not run: {len(bad)} row(s): {what}; the report says why")
    return out


def env_summary(df: pd.DataFrame) -> pd.DataFrame:
    """The distinct environments of a result set (one row per device/version combination)
    with the number of rows and the sources (measured / emulated / published) of each."""
    cols = [c for c in _ENV_COLS if c in df]
    if not cols or df.empty:
        return pd.DataFrame(columns=cols + ["rows", "source"])
    d = df[cols + ["source"]].astype(object).where(df[cols + ["source"]].notna(), "")
    if "gpu_runtime" in d and "platform" in d:  # the CUDA wheel's version means nothing on a CPU
        d.loc[d["platform"] == "cpu", "gpu_runtime"] = ""
    d = d[[c for c in d.columns if c == "source" or (d[c] != "").any()]]
    cols = [c for c in cols if c in d]
    if not cols:
        return pd.DataFrame({"rows": [len(d)], "source": [",".join(sorted(set(d["source"])))]})
    return (d.groupby(cols, sort=False).agg(rows=("source", "size"),
                                            source=("source", lambda v: ",".join(sorted(set(v)))))
            .reset_index())


class _Page:
    """Collects the parts of one report and its figures/tables."""

    def __init__(self, title: str):
        self.title = title
        # HTML, or a function of {table name: its CSV file} giving HTML (paged tables, which say
        # where every row is once the files are known)
        self.parts: list = [f"<h1>{html.escape(title)}</h1>"]
        self.figs: dict[str, object] = {}
        self.tables: dict[str, pd.DataFrame] = {}
        self._js = True
        self._pages = 0   # paged tables in the page

    def h2(self, text):
        self.parts.append(f"<h2>{html.escape(text)}</h2>")

    def h3(self, text):
        self.parts.append(f"<h3>{html.escape(text)}</h3>")

    def p(self, text, cls: str | None = None):
        c = f" class='{cls}'" if cls else ""
        self.parts.append(f"<p{c}>{html.escape(text)}</p>")

    def pre(self, text):
        self.parts.append(f"<pre>{html.escape(text)}</pre>")

    def fig(self, name: str, fig):
        self.figs[name] = fig
        # plotly.js (4.8 MB) is written once beside report.html (PLOTLYJS) and loaded from there:
        # the folder opens offline and report.html stays small
        self.parts.append(fig.to_html(full_html=False, include_plotlyjs=PLOTLYJS if self._js else False,
                                      div_id=f"fig-{name}", config={"displaylogo": False}))
        self._js = False

    def table(self, name: str | None, df: pd.DataFrame, fmt: str | None = None, highlight: str | None = None,
              scan: bool = False):
        """Add a table (and, with ``name``, its files). ``scan``: show it through
        :func:`scan_table` (empty columns dropped, shared values in a caption, notes as
        footnotes); the files keep every column. Numbers: :func:`flyexplore.views.tables.fmt_num` unless ``fmt``.
        ``highlight``: a boolean column whose true rows are marked (``diff``). A table of more
        than :data:`flyexplore.views.tables.PAGE_ROWS` rows is a paged table
        (:func:`~flyexplore.views.tables.paged_table`: its first page in the HTML, its rows
        embedded compressed, paged, filtered and sorted in the browser)."""
        if name:
            self.tables[name] = df
        marked: set[int] = set()
        if highlight and highlight in df:
            marked = set(np.flatnonzero(df[highlight].fillna(False).astype(bool).to_numpy()).tolist())
        notes: list[str] = []
        if scan:
            d, caption, notes = scan_table(df)
            if caption:
                self.parts.append(f"<p>All rows: {html.escape('; '.join(caption))}.</p>")
        else:
            d = text_frame(df, fmt)
        if len(d) > PAGE_ROWS:
            self._pages += 1
            tid = "tbl-" + _safe(name or f"t{self._pages}")

            def part(csv: dict[str, str], d=d, tid=tid, name=name, marked=marked) -> str:
                return paged_table(d, tid, file_note=csv.get(name) if name else None, marked=sorted(marked))
            self.parts.append(part)
        else:
            self.parts.append(static_table(d, marked))
        if notes:
            self.parts.append("<ol class='notes'>" + "".join(
                f"<li value='{i}'>{html.escape(n.split('] ', 1)[1])}</li>" for i, n in enumerate(notes, 1))
                + "</ol>")

    def write(self, out: Path, static: bool, formats: Sequence[str], table_formats: Sequence[str],
              keep: Iterable[str] = ()) -> Path:
        """Write the report into ``out`` (see :func:`check_report_dir` for which folders are
        refused): everything is written into a staging folder inside ``out`` first, each file
        whole and flushed to the disk (:mod:`flyexplore.atomic`); then an earlier report's
        entries are moved aside, the new ones moved in by rename, and the old ones deleted, so a
        failure while writing leaves the earlier report as it was (and a folder made for the
        report is removed again). Raises :class:`UsageError` when ``out`` is refused or cannot
        be written (checked before anything is written), :class:`~flyexplore.errors.WriteError`
        when a write fails midway (disk full, ...), naming the file by its place in ``out``
        (``cannot write rep/report.html: [Errno 28] No space left on device (the earlier report
        is unchanged)``)."""
        old = check_report_dir(out, keep)
        check_writable(out, "report folder", folder=True)
        made = [d for d in (out, *out.parents) if not d.exists()]  # removed again if writing fails
        try:
            out.mkdir(parents=True, exist_ok=True)
            stage = Path(tempfile.mkdtemp(prefix=_STAGING, dir=out))
        except OSError as exc:
            A.remove_empty(made)
            raise UsageError(f"cannot write report folder {str(out)!r}: {exc.strerror or exc}") from None
        try:
            return self._commit(out, stage, old, static, formats, table_formats, keep)
        except OSError as exc:   # disk full, a folder made read-only meanwhile, ...
            shutil.rmtree(stage, ignore_errors=True)
            A.remove_empty(made)
            # a staged file by its place in the folder asked for: what the user knows
            where = out
            if exc.filename is not None and Path(exc.filename).is_relative_to(stage):
                where = out / Path(exc.filename).relative_to(stage)
            left = "the earlier report is unchanged" if old else "no report was written"
            raise A.write_error(where, exc, left=left) from exc

    def _commit(self, out: Path, stage: Path, old: list[str], static: bool, formats: Sequence[str],
                table_formats: Sequence[str], keep: Iterable[str]) -> Path:
        try:
            path = self._write_into(stage, static, formats, table_formats)
            entries = sorted(p.name for p in stage.iterdir())
            earlier = _earlier_report(out)
            kept = sorted(n for n in set(keep) | (earlier[1] if earlier else set())
                          if (out / n).exists() and n not in entries)
            A.write_text(stage / REPORT_MARKER, json.dumps(
                {"flyexplore_report": __version__, "entries": entries, "kept": kept}, indent=1))
            trash = Path(tempfile.mkdtemp(prefix=_STAGING + "old-", dir=out))
            moved: list[str] = []
            try:
                for name in old:
                    os.replace(out / name, trash / name)
                for name in entries + [REPORT_MARKER]:
                    os.replace(stage / name, out / name)
                    moved.append(name)
            except OSError:          # put the earlier report back as it was
                for name in moved:
                    os.replace(out / name, stage / name)
                for p in trash.iterdir():
                    os.replace(p, out / p.name)
                trash.rmdir()
                raise
            A.sync_folder(out)
            shutil.rmtree(trash, ignore_errors=True)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        return out / path.name

    def _write_into(self, out: Path, static: bool, formats: Sequence[str], table_formats: Sequence[str]) -> Path:
        files = []
        skipped: list[str] = []
        if self.tables and table_formats:
            limit = E.TEXT_TABLE_MAX_ROWS   # read at write time (a test lowers it)
            files += save_tables(self.tables, out / "tables", table_formats, text_max_rows=limit)
            skipped = [f"{n} ({len(t):,} rows)" for n, t in self.tables.items() if len(t) > limit
                       and any(f != "csv" for f in table_formats)]
        csv = {p.stem: os.path.relpath(p, out) for p in files if p.suffix == ".csv"}
        if static and self.figs:
            why = None
            try:
                files += save_figures(self.figs, out / "figures", [f for f in formats if f in IMAGE_FORMATS])
            except RuntimeError as exc:
                why = str(exc)
            if why:
                self.parts.insert(1, f"<p class='note'>Static images not written: {html.escape(why)}</p>")
                self.static_problem = why
        if files:
            links = "".join(f"<li><a href='{html.escape(os.path.relpath(f, out))}'>"
                            f"{html.escape(os.path.relpath(f, out))}</a></li>" for f in files)
            self.parts.append(f"<h2>Files</h2><ul>{links}</ul>")
            if skipped:
                self.parts.append(f"<p>Tables over {limit:,} rows are written as CSV only (no "
                                  f"Markdown or LaTeX copy): {html.escape(', '.join(skipped))}.</p>")
        if self.figs:
            from plotly.offline import get_plotlyjs

            A.write_text(out / PLOTLYJS, get_plotlyjs())
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        self.parts.append(f"<p style='color:#777;font-size:11px'>written by flyexplore {__version__} at {stamp}</p>")
        body = [p(csv) if callable(p) else p for p in self.parts]
        if self._pages:
            body.append(pager_script())
        page = ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>" + html.escape(self.title) +
                f"</title><style>{_CSS}{PAGER_CSS}</style></head><body>" + "\n".join(body) + "</body></html>")
        path = out / "report.html"
        A.write_text(path, page)
        return path


#: plotly.js, written once into a report folder beside report.html, which loads it by this
#: relative name (no network needed; keep the folder together when moving a report).
PLOTLYJS = "plotly.min.js"

#: File a report folder gets, listing the entries the report wrote (``report.html``,
#: ``figures``, ``tables``: what the next report into the folder replaces) and the caller's
#: files it was told to keep beside them (``kept``, e.g. the demo's results).
REPORT_MARKER = ".flyexplore-report.json"
_STAGING = ".flyexplore-staging-"
#: What a report written before :data:`REPORT_MARKER` existed consists of.
_LEGACY_ENTRIES = ("report.html", "figures", "tables", ".report.html.tmp", "plotly.min.js")


def _names(values) -> set[str]:
    return {str(e) for e in values if "/" not in str(e) and str(e) not in ("", ".", "..")}


def _earlier_report(out: Path) -> tuple[set[str], set[str]] | None:
    """``(entries, kept)`` of the flyexplore report in ``out`` (from its marker; for an older
    report the fixed layout when its report.html says it was written by flyexplore); None if
    there is none."""
    marker = out / REPORT_MARKER
    if marker.is_file():
        try:
            info = json.loads(marker.read_text(encoding="utf-8"))
            return _names(info["entries"]), _names(info.get("kept", ()))
        except (OSError, ValueError, KeyError, TypeError):
            return None
    page = out / "report.html"
    try:
        if page.is_file() and "written by flyexplore" in page.read_text(encoding="utf-8", errors="replace"):
            return set(_LEGACY_ENTRIES), set()
    except OSError:
        return None
    return None


def check_report_dir(out_dir: str | Path, keep: Iterable[str] = ()) -> list[str]:
    """Check that a report may be written into ``out_dir`` and return the names of the earlier
    report's entries there, which the new report replaces.

    Allowed: a folder that does not exist or is empty, or one holding an earlier flyexplore
    report (its :data:`REPORT_MARKER`, or a ``report.html`` written by flyexplore) and nothing
    else but the names in ``keep`` or kept by that report (files the caller wrote there
    itself, such as the demo's results; they are left alone). Anything else raises
    :class:`UsageError` naming what is in the way; nothing is touched. Leftover staging folders
    of an interrupted report count as the report's."""
    out = Path(out_dir)
    if not out.exists():
        return []
    if not out.is_dir():
        raise UsageError(f"report folder {str(out)!r} is a file, not a folder")
    present = {p.name for p in out.iterdir()} - set(keep)
    stale = {n for n in present if n.startswith(_STAGING)}
    present -= stale
    if not present:
        return sorted(stale)
    earlier = _earlier_report(out)
    if earlier is None:
        shown = ", ".join(sorted(present)[:5]) + (" ..." if len(present) > 5 else "")
        raise UsageError(f"report folder {str(out)!r} is not empty and holds no earlier flyexplore report "
                         f"({shown}); choose a new or empty folder")
    owned, kept = earlier
    foreign = present - owned - kept - {REPORT_MARKER}
    if foreign:
        shown = ", ".join(sorted(foreign)[:5]) + (" ..." if len(foreign) > 5 else "")
        raise UsageError(f"report folder {str(out)!r} holds files that are not part of its earlier "
                         f"flyexplore report ({shown}); move them or choose another folder")
    return sorted((present & (owned | {REPORT_MARKER})) | stale)


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)


#: The columns :func:`flyexplore.views.plots.sweep_figure` reads besides the case parameters.
_SWEEP_COLS = ("op", "case", "dtype", "backend", "status", "time_ms", "tflops", "gbps", "params")


def _sweep_candidates(d: pd.DataFrame) -> list[str]:
    """Case parameters with three or more numeric values (candidates for a sweep figure)."""

    d, pcols = case_params(d)
    out = []
    for c in pcols:
        if pd.to_numeric(d[c], errors="coerce").dropna().nunique() >= 3:
            out.append(c)
    return out


def _op_section(page: _Page, op: str, d: pd.DataFrame, baseline, idx: int) -> None:

    page.h2(f"{op}")
    src = ", ".join(f"{n} {s}" for s, n in d["source"].value_counts().items())
    page.p(f"{len(d)} rows ({src}); {d['case'].nunique()} cases; dtypes {', '.join(sorted(d['dtype'].dropna().unique()))}; "
           f"backends {', '.join(d['backend'].dropna().unique())}.")
    bad = d[~d["status"].isin(["ok", "published"])]
    if len(bad):   # one line per distinct reason, not one per row
        parts = []
        for (st, be, msg), g in bad.groupby(["status", "backend", bad["message"].fillna("")], sort=False):
            parts.append(f"{be} {st} in {len(g)} row(s)" + (f": {msg}" if msg else ""))
        page.p(f"{len(bad)} row(s) not ok: " + "; ".join(parts), cls="note")
    name = _safe(f"{idx:02d}_{op.split(' on ')[0]}")
    bname = P.baseline_name(baseline)
    try:
        sp = R.speedup(d, baseline)
        fig = F.speedup_overview_figure(d, baseline, title=f"{op}: speedup over {bname}")
        page.p(verdict_sentence(sp["verdict"], than=bname, env_ab=bool(R.ab_envs(d))))
        page.fig(f"{name}_speedup", fig)
        gm = R.geomean_speedup(d, baseline)
        for r in gm.itertuples():
            page.p(f"Geometric mean, {r.backend} over {bname} ({r.op}, {r.dtype}, {r.cases} cases): "
                   f"{S.fmt_interval(r.geomean, r.geomean_lo, r.geomean_hi, None if pd.isna(r.verdict) else r.verdict)}"
                   " (95% interval).")
        page.table(f"{name}_geomean", gm)
    except UsageError as exc:
        page.p(f"No speedup figure: {exc}.")
    # compute-bound families (FLOP per byte >= 10) in TFLOP/s, memory-bound ones in GB/s
    ai = (pd.to_numeric(d["flops"], errors="coerce") / pd.to_numeric(d["bytes"], errors="coerce")).median()
    if d["tflops"].notna().any() and not (pd.notna(ai) and ai < 10 and d["gbps"].notna().any()):
        y = "tflops"
    else:
        y = "gbps" if d["gbps"].notna().any() else "time_ms"
    # the swept dimension whose lines cover the most rows (at least 40% of them, in at most
    # 8 lines: more is not readable; sweep_figure draws any set on request)
    best = None
    # only the columns a sweep figure reads (not the samples: each figure copies its rows)
    _, names = case_params(d[["params"]]) if "params" in d else (None, [])
    sd = d[[c for c in d.columns if c in _SWEEP_COLS or c in names]]
    for dim in _sweep_candidates(sd):
        try:
            fig = F.sweep_figure(sd, x=dim, y=y, min_points=3)
        except UsageError:
            continue
        drawn, dropped, lines = fig._flyexplore_points
        if drawn >= 0.4 * (drawn + dropped) and lines <= 8 and (best is None or drawn > best[0]):
            best = (drawn, dim, fig)
    if best:
        ylab = {"tflops": "TFLOP/s", "gbps": "GB/s", "time_ms": "time"}[y]
        fig = best[2]
        fig.layout.title.text = f"{op}: {ylab} across {best[1]}" + (
            "<br>" + fig.layout.title.text.split("<br>", 1)[1] if "<br>" in fig.layout.title.text else "")
        page.fig(f"{name}_sweep_{best[1]}", fig)


def write_report(df: pd.DataFrame, out_dir: str | Path, env=None, title: str = "flyexplore report",
                 baseline: str | Sequence[str] | None = None, static: bool = True,
                 formats: Iterable[str] = IMAGE_FORMATS, table_formats: Iterable[str] = ("csv", "md", "tex"),
                 published: bool | pd.DataFrame = False, peak_kind: str = "datasheet",
                 keep: Iterable[str] = (), sections: Sequence = ()) -> Path:
    """Write ``report.html`` to ``out_dir`` and return its path.

    Contents: the environment (``env.to_text()`` when an :class:`~flyexplore.world.env.Environment`
    is given, and always the distinct environments found in the rows), per operator a speedup
    figure against ``baseline`` (one backend, or a list: the faster of them; past
    :data:`flyexplore.views.plot_style.BAR_MAX_CASES` cases the speedup distribution instead of
    one bar per case) with its geometric
    means (``baseline`` None: :func:`flyexplore.results.table.default_baseline`, ``aten`` or an
    environment A/B's baseline arm) and, when a case parameter takes three or more values, a sweep figure; a roofline
    and a % of peak table when the rows come from one device with known peaks
    (:mod:`flyexplore.results.peaks`); the published-vs-measured comparison when ``published`` is true
    (or a published result set); for an environment A/B of three or more environments (a build
    series) its figure and table (:func:`flyexplore.views.series.series_section`); and the result
    table (every table of more than :data:`flyexplore.views.tables.PAGE_ROWS` rows is paged in the
    page, :func:`~flyexplore.views.tables.paged_table`).

    ``static``: also write the figures as ``figures/*.{png,svg,pdf}`` (``formats``) with kaleido;
    when that is impossible here the report says why and is written without them.
    ``table_formats``: tables under ``tables/`` (csv, md, tex, html). ``out_dir`` must be new,
    empty, or hold an earlier flyexplore report (replaced whole) and only the files named in
    ``keep`` besides (:func:`check_report_dir`). ``sections``: callables ``f(page)`` adding
    more sections after the environment (the demo's FlyDSL section). Raises ``UsageError``, before
    anything is written, for another folder, an unwritable ``out_dir``
    (:func:`flyexplore.views.export.check_writable`) and a ``baseline`` that is not a backend of
    ``df`` (:func:`flyexplore.results.table.check_backends`). A write that fails midway (disk full)
    raises :class:`~flyexplore.errors.WriteError` (an ``OSError``) naming the file in ``out_dir``
    and leaves the folder as it was."""

    out = Path(out_dir)
    check_report_dir(out, keep)
    check_writable(out, "report folder", folder=True)
    R.release_arrow_memory()
    df = R.normalize(df)
    if baseline is None:   # aten, or an environment A/B's baseline arm (flash@0.13b)
        baseline = R.default_baseline(df)
    R.check_backends(df, baseline)
    page = _Page(title)
    n_pub = int((df["source"] == "published").sum())
    counts = ", ".join(f"{n} {s}" for s, n in df["source"].value_counts().items())
    page.p(f"{len(df)} result rows ({counts or 'none'}).")
    if n_pub:
        page.p(f"{n_pub} row(s) are published figures (AMD Instinct MI355X, see the provenance column "
               "and data/published/SOURCES.md); flyexplore did not measure them.", cls="note")
    page.h2("Environment")
    if env is not None:
        page.pre(env.to_text())
    page.table("environments", env_summary(df))
    for add in sections:
        add(page)
    if len(R.ab_envs(df)) >= 3:   # a build series: each case across the environments, in run order
        series_section(page, df)
    if "model_uses" in df.columns and df["model_uses"].notna().any():  # a sweep of a model's exported calls
        weighted_section(df, baseline if isinstance(baseline, str) else baseline[0])(page)
    # one section per operator and device: speedups never mix rows of different devices
    # (one group's rows at a time: a copy of every group at once would double the memory)
    dev_key = df["device"].astype(object).where(df["device"].notna(), "unknown device")
    groups = df.groupby([df["op"], dev_key], sort=False).indices
    ndev = df["device"].nunique(dropna=False)
    for i, ((op, dev), idx) in enumerate(groups.items()):
        label = f"{op} on {dev}" if ndev > 1 else str(op)
        _op_section(page, label, df.take(idx), baseline, i)
        R.release_arrow_memory()   # the section's copy of its rows (arrow strings) back to the system
    devs = [v for v in df["device"].dropna().unique() if K.find_device(str(v))]
    ok = df["status"].isin(["ok", "published"])
    for j, dev in enumerate(devs):
        od = df[ok & (df["device"] == dev)]
        if not od["flops"].fillna(0).gt(0).any() and not od["gbps"].notna().any():
            continue
        sfx = "" if len(devs) == 1 else f"_{j}"
        page.h2(f"Roofline and % of peak ({dev})")
        try:
            page.fig(f"roofline{sfx}", F.roofline_figure(od, device=str(dev), kind="measured",
                                                         title=f"Roofline on {K.find_device(str(dev)).name} ({dev})"))
        except UsageError as exc:
            page.p(f"No roofline: {exc}.")
        pk = K.percent_of_peak(od, kind=peak_kind)
        page.table(f"percent_of_peak{sfx}", pk[["op", "case", "dtype", "backend", "tflops", "pct_peak_tflops", "gbps",
                                                "pct_peak_gbps", "peak_device", "peak_tflops", "peak_gbps"]])
        d = K.find_device(str(dev))
        page.p(f"Peaks ({peak_kind}): {d.source}" + (f"; measured: {d.measured_source}" if d.measured_source else ""))
    if published is not False and published is not None:

        pub = load() if published is True else published
        page.h2("Measured vs published (MI355X)")
        meas = df[df["source"] != "published"]
        try:
            page.fig("published_vs_measured", FC.published_vs_measured_figure(meas, pub, "speedup", baseline))
        except UsageError as exc:
            page.p(f"No comparison: {exc}.")

        page.h3("Published headline numbers (recomputed from the per-case figures)")
        page.table("published_headlines", headlines())
        page.h3("Published only as ranges (no per-case values are public)")
        page.table("published_ranges", ranges())
    page.h2("Results")
    page.p("Times in µs (median over rounds; time_ci_us: its 95% interval; per_call_us: one call within a "
           "round). Speedup: baseline time / backend time, est [95% interval], with its verdict.")
    page.table("results", summary_table(df), scan=True)
    return page.write(out, static, list(formats), list(table_formats), keep)


def weighted_section(df: pd.DataFrame, baseline: str = "aten"):
    """A report section for a sweep of exported model shapes: the measured whole-model
    kernel-time estimate (:func:`flyexplore.results.model.weighted_estimate`)."""
    def add(page):
        page.h2("Model-weighted estimate (measured)")
        try:
            w = RM.weighted_estimate(df, baseline=baseline)
        except Exception as exc:  # noqa: BLE001 - a report section never stops the report
            page.p(f"No estimate: {exc}")
            return
        if w.empty:
            page.p("No case of the model's calls was measured with both the baseline and another backend.")
            return
        page.p(w.attrs.get("note", ""), cls="note")
        page.table("model_weighted", w)
        v = RM.variant_estimate(df, baseline=baseline)
        if len(v):
            page.h3("What-if variants (measured)")
            page.p("The model's calls as they are, at the baseline, against the changed calls the what-if advice "
                   "describes, at flydsl; weighted by call count.", cls="note")
            page.table("model_what_if", v)
    return add


def write_sections(sections: Sequence, out_dir: str | Path, title: str, static: bool = True,
                   formats: Iterable[str] = IMAGE_FORMATS, table_formats: Iterable[str] = ("csv", "md")) -> Path:
    """Write a report made only of ``sections`` (callables ``f(page)``, as :func:`write_report`
    takes) into ``out_dir`` under the same folder rules (:func:`check_report_dir`). Returns the
    path of ``report.html``."""
    page = _Page(title)
    for add in sections:
        add(page)
    return page.write(Path(out_dir), static, list(formats), list(table_formats))


def write_ab_report(sd: Sides, out_dir: str | Path, title: str | None = None, static: bool = True,
                    with_published: bool = True, formats: Iterable[str] = IMAGE_FORMATS,
                    table_formats: Iterable[str] = ("csv", "md", "tex")) -> Path:
    """Write the A/B report of two sides already read and paired
    (:func:`flyexplore.results.compare.sides`) to ``out_dir/report.html`` and return its path:
    result rows as :func:`write_compare_report` describes, ``vllm bench serve`` arms as
    :func:`write_vllm_report` does (``with_published``: the published MI355X A/B beside them)."""
    R.release_arrow_memory()
    page = _compare_page(sd, title) if sd.kind == "rows" else _vllm_page(sd, title, with_published)
    return page.write(Path(out_dir), static, list(formats), list(table_formats))


def write_compare_report(a: pd.DataFrame, b: pd.DataFrame, out_dir: str | Path,
                         names: tuple[str, str] = ("A", "B"), a_backend: str | None = None,
                         b_backend: str | None = None, title: str | None = None, static: bool = True,
                         formats: Iterable[str] = IMAGE_FORMATS,
                         table_formats: Iterable[str] = ("csv", "md", "tex")) -> Path:
    """Write the A/B report of two result sets to ``out_dir/report.html`` (see
    :func:`flyexplore.results.compare.pair`): the two environments side by side (differing fields
    marked), the summary per (op, dtype, backend) with geometric means, the ratio figure and its
    distribution (a rank curve past :data:`flyexplore.views.plot_style.BAR_MAX_CASES` cases), the
    paired table and the cases present in one side only (paged past
    :data:`flyexplore.views.tables.PAGE_ROWS` rows). Returns the path. Raises ``UsageError`` when
    nothing pairs."""

    na, nb = R.normalize(a), R.normalize(b)
    return write_ab_report(Sides("rows", na, nb, pair(na, nb, names, a_backend, b_backend), names), out_dir,
                           title, static, formats=formats, table_formats=table_formats)


def _synthetic_banner(page: _Page, sd: Sides) -> None:
    """The made-up-inputs banner, right under the title (:func:`flyexplore.results.compare.is_synthetic`)."""
    if is_synthetic(sd):
        page.p(SYNTHETIC_LINE + ".", cls="note")


def _compare_page(sd: Sides, title: str | None) -> _Page:
    ab, names = sd.ab, sd.names
    page = _Page(title or f"A/B: {names[1]} vs {names[0]}")
    _synthetic_banner(page, sd)
    gm = S.fmt_interval(*ab.geomean_ci)
    page.p(f"ratio = time {names[0]} / time {names[1]} per case (> 1: {names[1]} faster); "
           f"{len(ab.pairs)} pairs, geometric mean {gm}{'' if 'no interval' in gm else ' (95% interval)'}. "
           + verdict_sentence(ab.pairs["verdict"], f"{names[1]} faster", names[0], env_ab=bool(R.ab_envs(sd.a))))
    for line in ab.setting:
        page.p(line[0].upper() + line[1:] + ".")
    for w in ab.warnings:
        page.p("Environments differ: " + w + ". Ratios mix this difference with the code's.", cls="note")
    page.h2("Environments")
    page.table("environments", ab.env, highlight="differs")
    page.h2("Summary")
    page.table("summary", ab.summary)
    page.fig("ab", FC.ab_figure(ab))
    page.h2("Pairs")
    page.table("pairs", ab.pairs)
    report_section(page, ab, sd.a, sd.b)
    for side, d in ((names[0], ab.only_a), (names[1], ab.only_b)):
        page.h3(f"Only in {side} ({len(d)})")
        if len(d):
            page.table(_safe(f"only_in_{side}"), d)
        else:
            page.p("none")
    return page


def write_vllm_report(a_paths, b_paths, out_dir: str | Path, names: tuple[str, str] = ("A", "B"),
                      title: str | None = None, static: bool = True, with_published: bool = True,
                      formats: Iterable[str] = IMAGE_FORMATS,
                      table_formats: Iterable[str] = ("csv", "md", "tex")) -> Path:
    """Write the vLLM serving A/B report of two arms (files or folders of
    ``vllm bench serve --save-result`` JSON, see :mod:`flyexplore.results.vllm`): the runs of each arm,
    the per-metric speedups of B over A against concurrency, the paired table, keys present in
    one arm only, and (``with_published``) the published MI355X whole-request A/B for
    reference. Returns the path of ``report.html``."""

    ra, rb = V.load_runs(a_paths), V.load_runs(b_paths)
    return write_ab_report(Sides("vllm", ra, rb, V.ab_table(ra, rb, names=names), names), out_dir, title,
                           static, with_published, formats, table_formats)


def _vllm_page(sd: Sides, title: str | None, with_published: bool) -> _Page:
    ab, names, ra, rb = sd.ab, sd.names, sd.a, sd.b
    page = _Page(title or f"vLLM serving A/B: {names[1]} vs {names[0]}")
    _synthetic_banner(page, sd)
    page.p(f"speedup of {names[1]} over {names[0]} per (model, concurrency, request rate) and metric: "
           f"latency {names[0]}/{names[1]}, throughput {names[1]}/{names[0]}; > 1: {names[1]} better.")
    page.fig("vllm_ab", FC.vllm_figure(ab, title=f"vLLM serving A/B: {names[1]} vs {names[0]}"))
    page.h2("Pairs")
    page.table("vllm_pairs", ab)
    for side, lst in ((names[0], ab.attrs["only_a"]), (names[1], ab.attrs["only_b"])):
        page.p(f"Only in {side}: {', '.join(lst) if lst else 'none'}")
    page.h2("Runs")
    for side, r in ((names[0], ra), (names[1], rb)):
        page.h3(side)
        page.table(_safe(f"runs_{side}"), r)
    if with_published:
        page.h2("Published MI355X whole-request A/B (for reference)")
        page.fig("vllm_published", FC.vllm_figure(vllm_published(), title="Published vLLM A/B on MI355X"))

        rg = ranges()
        page.p("MXFP4 is public only as ranges (no per-case values):")
        page.table("published_ranges", rg[rg["what"].str.contains("vLLM")])
    return page


def refuse_no_rows(df, paths, why: str = "nothing to report") -> None:
    """Raise :class:`UsageError`, one line naming the files, when the rows read from ``paths``
    (``df``) are none: a CSV file with its header only, an empty ``.jsonl``, a Parquet file of 0
    rows (what a sweep stopped before its first row leaves) is a valid result file, but a report
    of it would only say ``0 result rows`` (issue 45). ``paths``: one path or several. The command
    line (``flyexplore report``) and :func:`flyexplore.report` both call it."""
    if len(df):
        return
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    names = ", ".join(repr(str(x)) for x in paths)
    one = len(paths) == 1
    raise UsageError(f"result file{'' if one else 's'} {names} hold{'s' if one else ''} no result rows "
                     f"(a header only, or nothing): {why}")
