"""Issue 46's goals "steps found" and "speed": a history store's step detection on series made
from real measured runs, and ``history show`` of 1,000 runs x 100 cases.

``run OUT [--only steps|speed] [--seeds 20]``
    **Steps.** Series of synthetic runs made from real rows, "samples scaled with the times":
    run ``i`` of a series is a measured run's rows (GPU: ``data/h200/reproducible/run1..3.parquet``,
    24 GEMM rows of an H200; CPU: ``data/bench/reproducible_cpu/run1..2.parquet``, 12 rows), the
    templates taken in turn, every time column, every sample of ``samples_ms`` and the times in
    ``process_estimates`` multiplied by one factor per run and row (the speedups and throughputs
    follow), so that every row still passes :func:`flyexplore.results.table.validate` and its
    interval is its measured one, scaled. The factor moves the template's row to the row's mean
    over the measured runs, then by ``exp(c_i + e_ij)``, then by the step (1.03 GPU, 1.20 CPU) for
    runs ``i >= 20`` (0-based, of 30): ``c_i`` a common per-run shift, normal with the sd of the
    measured runs' mean log deviation; ``e_ij`` drawn (bootstrap) from the measured runs' per-row
    log deviations less that shift (scaled by ``sqrt(K / (K - 1))`` for K runs). Noise models:
    ``measured`` (the above, GPU and CPU) and, on the GPU, ``calibration`` (``e_ij`` normal with
    the sd of one process's run-to-run move, ``p95 / (1.96 sqrt 2)`` of
    ``data/h200/reproducible/calibration.json``: a history of runs of one process each). Each
    series goes into a fresh :class:`~flyexplore.results.history_store.Store` and is read by
    :func:`flyexplore.results.history.analyse`: per seed, whether the geometric mean's step is
    found at run 20 +- 1, the share of case series that find it there, the steps found elsewhere;
    and per seed a series of 10 runs without a step (goal: no step found).

    **Speed.** A store of 1,000 runs x 100 cases (synthetic rows without samples, added through
    :meth:`Store.add`), every run one build (the learned allowance's worst case: every pair of
    runs is compared) and a build every 10 runs; timed: ``Store.points()`` + ``analyse`` +
    ``show_lines`` in this process, and ``python -m flyexplore history show --store DIR`` (a
    fresh interpreter) where the command exists. Goal: < 5 s on 2 cores.

    Writes ``OUT/results.json``, ``OUT/summary.md`` and ``OUT/provenance.json`` (the command line
    under ``command``). ``--only`` re-runs one part and keeps the other's results.

``summary OUT``
    Re-writes ``OUT/summary.md`` from ``OUT/results.json``.

Usage (repository root)::

    python benchmarks/evidence/history_steps.py run data/cpu/history_steps
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

SCRIPT = "benchmarks/evidence/history_steps.py"
KEY = ["op", "case", "dtype", "backend"]
#: The measured runs each platform's series are made from, the step injected and its run.
SOURCES = {"gpu": [f"data/h200/reproducible/run{i}.parquet" for i in (1, 2, 3)],
           "cpu": [f"data/bench/reproducible_cpu/run{i}.parquet" for i in (1, 2)]}
STEP = {"gpu": 1.03, "cpu": 1.20}
CALIBRATION = "data/h200/reproducible/calibration.json"
RUNS, AT, WINDOW, NULL_RUNS = 30, 20, 1, 10
#: Columns in ms (scaled with the time), and columns inverse to it.
TIME_COLS = ("time_ms", "time_iqr_ms", "time_p20_ms", "time_p80_ms", "time_min_ms", "time_mean_ms", "per_call_ms",
             "first_call_ms", "time_ci_lo_ms", "time_ci_hi_ms", "time_cycles")
RATE_COLS = ("tflops", "gbps")
SPEED_GOAL_S = 5.0


# -- the noise ------------------------------------------------------------------------------------

class Noise:
    """The measured runs of one platform and the run-to-run spread read from them."""

    def __init__(self, platform: str):
        from flyexplore.results import table as R

        self.platform = platform
        runs = [R.load(ROOT / p, validated=True) for p in SOURCES[platform]]
        keys = runs[0][KEY].astype(str).agg("|".join, axis=1).tolist()
        self.templates = []
        for r in runs:
            r = r.assign(_k=r[KEY].astype(str).agg("|".join, axis=1)).set_index("_k").loc[keys].reset_index(drop=True)
            self.templates.append(r)
        T = np.log(np.column_stack([t["time_ms"].to_numpy(dtype=float) for t in self.templates]))   # rows x K
        K = T.shape[1]
        self.dev = T - T.mean(axis=1, keepdims=True)             # each template's row off the row's mean
        common = self.dev.mean(axis=0)                           # each measured run's shift
        self.sd_common = float(np.sqrt((common ** 2).sum() / (K - 1)))
        self.resid = ((self.dev - common) * math.sqrt(K / (K - 1))).ravel()
        self.sd_resid = float(self.resid.std())
        self.samples = [[_parse(s) for s in t["samples_ms"]] for t in self.templates]
        # each template's geometric-mean interval as history.analyse reads it (sd in log space)
        self.geomean_sd = []
        for t in self.templates:
            sg = (np.log(t["time_ci_hi_ms"].to_numpy(dtype=float)) - np.log(t["time_ci_lo_ms"].to_numpy(dtype=float))) \
                / (2 * 1.959963984540054)
            self.geomean_sd.append(float(np.sqrt((sg ** 2).sum()) / sg.size))
        cal = json.loads((ROOT / CALIBRATION).read_text())
        self.sd_calibration = float(cal["p95"]) / (1.959963984540054 * math.sqrt(2))

    def factors(self, rng: np.random.Generator, n_runs: int, model: str) -> np.ndarray:
        """``exp(c_i + e_ij)``: runs x rows."""
        rows = self.dev.shape[0]
        c = rng.normal(0.0, self.sd_common, size=(n_runs, 1))
        if model == "measured":
            e = rng.choice(self.resid, size=(n_runs, rows), replace=True)
        elif model == "calibration":
            e = rng.normal(0.0, self.sd_calibration, size=(n_runs, rows))
        else:
            raise ValueError(model)
        return np.exp(c + e)


def _parse(text) -> list[np.ndarray] | None:
    if text is None or (isinstance(text, float) and math.isnan(text)) or text is pd.NA:
        return None
    return [np.asarray(r, dtype=float) for r in json.loads(text)]


def _samples_text(rounds: list[np.ndarray], f: float) -> str:
    return "[" + ",".join("[" + ",".join(f"{v:.10g}" for v in r * f) + "]" for r in rounds) + "]"


def _scaled_run(noise: Noise, k: int, f: np.ndarray, i: int, tag: str) -> pd.DataFrame:
    """Template ``k``'s rows as run ``i`` of a series: row j's times x ``f[j] / exp(dev[j, k])``."""
    t = scale_rows(noise.templates[k], f / np.exp(noise.dev[:, k]), noise.samples[k])
    ts = pd.to_datetime(t["timestamp"].astype(str), utc=True) + pd.Timedelta(days=i)
    t["timestamp"] = ts.dt.strftime("%Y-%m-%dT%H:%M:%S+00:00")
    t["run_id"] = f"{tag}-r{i:03d}"
    return t


def scale_rows(rows: pd.DataFrame, g: np.ndarray, samples: list | None = None) -> pd.DataFrame:
    """A copy of result ``rows`` with row j ``g[j]`` times slower, as a measurement of it would
    read: every time column and every sample (``samples``: the rows' parsed ``samples_ms``, else
    parsed here) times ``g[j]``, the rates over it, the speedups over a baseline of the same case
    and the per-process estimates moved alike, so that the rows still pass validation. (Also
    used by ``history_gpu_runs.py``.)"""
    t = rows.copy()
    g = np.broadcast_to(np.asarray(g, dtype=float), (len(t),))
    samples = [_parse(s) for s in t["samples_ms"]] if samples is None else samples
    for c in TIME_COLS:
        if c in t:
            t[c] = t[c] * g
    for c in RATE_COLS:
        if c in t:
            t[c] = t[c] / g
    t["samples_ms"] = [None if s is None else _samples_text(s, gj) for s, gj in zip(samples, g)]
    # speedups over the baseline of the same (op, case, dtype): time_base / time_row
    base = {}
    for j, r in enumerate(t[["op", "case", "dtype", "backend"]].astype(str).itertuples(index=False)):
        base[(r.op, r.case, r.dtype, r.backend)] = g[j]
    ratio = np.ones(len(t))
    for j, r in enumerate(t[["op", "case", "dtype", "baseline"]].astype("string").fillna("").itertuples(index=False)):
        b = base.get((r.op, r.case, r.dtype, r.baseline))
        if b is not None:
            ratio[j] = b / g[j]
    for c in ("speedup", "speedup_lo", "speedup_hi"):
        if c in t:
            t[c] = t[c] * ratio
    if "process_estimates" in t:
        t["process_estimates"] = [_estimates(p, gj, rj) for p, gj, rj in zip(t["process_estimates"], g, ratio)]
    return t


def _estimates(text, g: float, ratio: float):
    if text is None or text is pd.NA or (isinstance(text, float) and math.isnan(text)):
        return text
    es = json.loads(text)
    for e in es:
        for c in ("time_ms", "time_se"):
            if isinstance(e.get(c), (int, float)):
                e[c] = e[c] * g
        for c in ("speedup", "speedup_se"):
            if isinstance(e.get(c), (int, float)):
                e[c] = e[c] * ratio
    return json.dumps(es)


def make_series(noise: Noise, seed: int, n_runs: int, at: int | None, step: float, model: str, tag: str) -> pd.DataFrame:
    """One series: ``n_runs`` runs, times x ``step`` from run ``at`` on (None: no step)."""
    rng = np.random.default_rng(seed)
    F = noise.factors(rng, n_runs, model)
    K = len(noise.templates)
    runs = []
    for i in range(n_runs):
        s = step if at is not None and i >= at else 1.0
        runs.append(_scaled_run(noise, i % K, F[i] * s, i, tag))
    return pd.concat(runs, ignore_index=True)


def read_steps(rows: pd.DataFrame, at: int | None) -> dict:
    """Add ``rows`` to a fresh store, analyse it and read the steps."""
    from flyexplore.results.history import GEOMEAN, analyse
    from flyexplore.results.history_store import Store

    with tempfile.TemporaryDirectory(prefix="history-steps-") as d:
        st = Store(Path(d) / "store")
        added = st.add([rows])
        an = analyse(st.points(), store=str(st.path))
    s = an.steps
    gm = s[s["series"] == GEOMEAN]
    cs = s[s["series"] != GEOMEAN]
    n_series = int(an.trends["series"].nunique())
    out = {"runs": int(an.runs["run_id"].nunique()), "rows_added": added.rows_added, "series": n_series,
           "geomean_steps": [{"position": int(r.position), "change": float(r.change), "lo": float(r.lo),
                              "hi": float(r.hi)} for r in gm.itertuples()],
           "case_steps": int(len(cs))}
    if at is not None:
        near = cs[(cs["position"] - at).abs() <= WINDOW]
        out["geomean_found"] = bool(((gm["position"] - at).abs() <= WINDOW).any())
        out["geomean_exact"] = bool(((gm["position"] - at) == 0).any())
        out["geomean_elsewhere"] = int(((gm["position"] - at).abs() > WINDOW).sum())
        out["cases_found"] = int(near["series"].nunique())
        out["cases_found_share"] = out["cases_found"] / n_series
        out["case_steps_elsewhere"] = int(((cs["position"] - at).abs() > WINDOW).sum())
        out["case_steps_elsewhere_at"] = sorted(int(p) for p in cs["position"] if abs(p - at) > WINDOW)
        hit = gm[(gm["position"] - at).abs() <= WINDOW]
        if len(hit):
            out["geomean_change"] = float(hit["change"].iloc[0])
    return out


def steps_part(seeds: int) -> dict:
    res = {"settings": {"runs": RUNS, "at": AT, "window": WINDOW, "null_runs": NULL_RUNS, "seeds": seeds,
                        "step": STEP, "sources": SOURCES, "calibration": CALIBRATION}, "platforms": {}}
    for plat in ("gpu", "cpu"):
        noise = Noise(plat)
        models = ("measured", "calibration") if plat == "gpu" else ("measured",)
        pr = {"rows": len(noise.templates[0]), "templates": len(noise.templates),
              "sd_common": noise.sd_common, "sd_resid": noise.sd_resid, "sd_calibration": noise.sd_calibration,
              "row_sd_measured": float(noise.dev.std(axis=1, ddof=1).mean()), "geomean_sd": noise.geomean_sd,
              "models": {}}
        for model in models:
            steps, nulls = [], []
            t0 = time.monotonic()
            for seed in range(seeds):
                rows = make_series(noise, 1000 + seed, RUNS, AT, STEP[plat], model, f"{plat}-{model}-s{seed:02d}")
                r = read_steps(rows, AT)
                r["seed"] = 1000 + seed
                if r.get("geomean_change") is not None:
                    hit = [g for g in r["geomean_steps"] if abs(g["position"] - AT) <= WINDOW][0]
                    r["geomean_covers_step"] = bool(hit["lo"] <= STEP[plat] - 1 <= hit["hi"])
                steps.append(r)
                rows = make_series(noise, 5000 + seed, NULL_RUNS, None, 1.0, model, f"{plat}-{model}-null{seed:02d}")
                n = read_steps(rows, None)
                n["seed"] = 5000 + seed
                nulls.append(n)
                print(f"{plat} {model} seed {seed}: geomean found {r['geomean_found']} "
                      f"{[g['position'] for g in r['geomean_steps']]}, cases {r['cases_found']}/{r['series']}, "
                      f"elsewhere {r['case_steps_elsewhere']}; null: geomean {len(n['geomean_steps'])}, "
                      f"cases {n['case_steps']}", flush=True)
            pr["models"][model] = {"step_series": steps, "null_series": nulls,
                                   "wall_s": round(time.monotonic() - t0, 1)}
        res["platforms"][plat] = pr
    return res


# -- speed ----------------------------------------------------------------------------------------

def speed_rows(n_runs: int, n_cases: int, builds_every: int | None, seed: int = 7) -> pd.DataFrame:
    """``n_runs`` x ``n_cases`` synthetic ok rows (one H200 row's columns, no samples), one
    device; ``builds_every``: a new ``env_id`` / commit every that many runs (None: one build)."""
    from flyexplore.results import table as R

    tpl = R.load(ROOT / SOURCES["gpu"][0]).iloc[[0]]
    tpl = tpl.assign(samples_ms=None, process_estimates=None, round_clock_mhz=None, speedup=np.nan,
                     speedup_lo=np.nan, speedup_hi=np.nan, verdict=None, baseline=None, processes=1)
    rng = np.random.default_rng(seed)
    base = np.exp(rng.uniform(np.log(0.01), np.log(10.0), n_cases))
    rows = tpl.loc[tpl.index.repeat(n_runs * n_cases)].reset_index(drop=True)
    run = np.repeat(np.arange(n_runs), n_cases)
    case = np.tile(np.arange(n_cases), n_runs)
    t = base[case] * np.exp(rng.normal(0, 0.01, run.size)) * np.where(run >= n_runs * 2 // 3, 1.03, 1.0)
    half = t * 0.01
    rows["time_ms"], rows["time_ci_lo_ms"], rows["time_ci_hi_ms"] = t, t - half, t + half
    for c in ("time_iqr_ms", "time_p20_ms", "time_p80_ms", "time_min_ms", "time_mean_ms", "per_call_ms", "tflops",
              "gbps", "time_cycles"):
        rows[c] = np.nan
    rows["case"] = [f"{16 * (j + 1)}x4096x4096" for j in case]
    rows["run_id"] = [f"speed-r{i:04d}" for i in run]
    ts = pd.Timestamp("2027-01-01T00:00:00Z") + pd.to_timedelta(run, unit="h")
    rows["timestamp"] = ts.strftime("%Y-%m-%dT%H:%M:%S+00:00")
    if builds_every:
        rows["env_id"] = [f"build{i // builds_every:04d}" for i in run]
        rows["flyexplore_commit"] = [f"{i // builds_every:040x}" for i in run]
    return rows


def _time_show(path: Path, reps: int) -> dict:
    from flyexplore.results.history import analyse, show_lines
    from flyexplore.results.history_store import Store

    st = Store(path)
    parts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        pts = st.points()
        t1 = time.perf_counter()
        an = analyse(pts, store=str(path))
        t2 = time.perf_counter()
        lines = show_lines(an)
        t3 = time.perf_counter()
        parts.append({"points_s": t1 - t0, "analyse_s": t2 - t1, "show_lines_s": t3 - t2, "total_s": t3 - t0})
    out = {"reps": parts, "median_total_s": float(np.median([p["total_s"] for p in parts])),
           "max_total_s": float(max(p["total_s"] for p in parts)), "lines": len(lines),
           "steps": int(len(an.steps)), "head": lines[:6]}
    cli = ROOT / "flyexplore" / "cli" / "history.py"
    if cli.exists():
        walls = []
        for _ in range(reps):
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, "-m", "flyexplore", "history", "show", "--store", str(path)],
                               cwd=ROOT, capture_output=True, text=True, timeout=600)
            walls.append(time.perf_counter() - t0)
        out["cli"] = {"rc": p.returncode, "wall_s": walls, "median_s": float(np.median(walls)),
                      "tail": (p.stdout + p.stderr).strip().splitlines()[-3:]}
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import flyexplore.cli"], cwd=ROOT, capture_output=True, timeout=600)
        out["cli"]["interpreter_and_import_s"] = time.perf_counter() - t0
    else:
        out["cli"] = None
    return out


def speed_part(n_runs: int, n_cases: int, reps: int) -> dict:
    from flyexplore.results.history_store import Store

    res = {"runs": n_runs, "cases": n_cases, "goal_s": SPEED_GOAL_S, "stores": {}}
    for name, every in (("one build", None), ("a build every 10 runs", 10)):
        rows = speed_rows(n_runs, n_cases, every)
        with tempfile.TemporaryDirectory(prefix="history-speed-") as d:
            path = Path(d) / "store"
            t0 = time.perf_counter()
            added = Store(path).add([rows])
            add_s = time.perf_counter() - t0
            r = {"add_s": add_s, "rows_added": added.rows_added, "runs_added": added.runs_added,
                 "index_mb": (path / "history.sqlite").stat().st_size / 2**20}
            r.update(_time_show(path, reps))
            shutil.rmtree(path)
        res["stores"][name] = r
        print(f"speed ({name}): add {add_s:.1f} s; show median {r['median_total_s']:.2f} s "
              f"(max {r['max_total_s']:.2f}); cli {r['cli'] and r['cli']['median_s']}", flush=True)
    return res


# -- summary --------------------------------------------------------------------------------------

def _pct(x: float) -> str:
    return f"{x:.1%}"


def summary(out: Path) -> list[str]:
    res = json.loads((out / "results.json").read_text())
    prov = json.loads((out / "provenance.json").read_text()) if (out / "provenance.json").exists() else {}
    from flyexplore.world.env import provenance_line

    lines = ["# History: steps found, and `history show`'s speed (issue 46)", "",
             provenance_line(prov) if prov else "", ""]
    st = res.get("steps")
    if st:
        s = st["settings"]
        lines += ["## Steps found", "",
                  f"Each series: {s['runs']} runs made from measured rows (samples scaled with the times), a step at run "
                  f"{s['at']} (0-based; runs {s['at']}..{s['runs'] - 1} slower), found when a step is reported at run "
                  f"{s['at']} +- {s['window']}; and {s['seeds']} series of {s['null_runs']} runs without a step. "
                  f"{s['seeds']} seeds each.", "",
                  "| platform | noise | step | seeds: geomean step at 20 +- 1 | at exactly 20 | interval covers the step | "
                  "geomean steps elsewhere | case series finding it at 20 +- 1 (median, min of seeds) | case steps elsewhere "
                  "| no-step series: geomean steps | no-step series: case steps |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for plat, pr in st["platforms"].items():
            for model, m in pr["models"].items():
                ss, ns = m["step_series"], m["null_series"]
                n = len(ss)
                shares = [r["cases_found_share"] for r in ss]
                lines.append(
                    f"| {plat} | {model} | +{STEP[plat] - 1:.0%} | {sum(r['geomean_found'] for r in ss)}/{n} | "
                    f"{sum(r['geomean_exact'] for r in ss)}/{n} | "
                    f"{sum(bool(r.get('geomean_covers_step')) for r in ss)}/{sum(r['geomean_found'] for r in ss)} | "
                    f"{sum(r['geomean_elsewhere'] for r in ss)} | {_pct(float(np.median(shares)))}, {_pct(min(shares))} "
                    f"(of {ss[0]['series']}) | {sum(r['case_steps_elsewhere'] for r in ss)} in {n * ss[0]['series']} "
                    f"({sum(abs(p - s['at']) <= 3 for r in ss for p in r.get('case_steps_elsewhere_at', []))} "
                    f"at 20 +- 2..3) | "
                    f"{sum(len(r['geomean_steps']) for r in ns)} in {len(ns)} | "
                    f"{sum(r['case_steps'] for r in ns)} in {len(ns) * ns[0]['series']} |")
        lines += ["", "Noise (log-space standard deviations, i.e. fractions):", ""]
        for plat, pr in st["platforms"].items():
            lines.append(f"- {plat}: {pr['templates']} measured runs of {pr['rows']} rows; common per-run shift sd "
                         f"{_pct(pr['sd_common'])}; per-row deviation less the shift, sd {_pct(pr['sd_resid'])} "
                         f"(bootstrapped, `measured`); a row's sd over the runs, mean {_pct(pr['row_sd_measured'])}"
                         + (f"; one process's run-to-run sd from calibration.json's p95: {_pct(pr['sd_calibration'])} "
                            "(`calibration`)" if plat == "gpu" else ""))
        lines += ["", *WHY]
        for plat, pr in st["platforms"].items():
            for model, m in pr["models"].items():
                ss = m["step_series"]
                extra = [r for r in ss if r["geomean_elsewhere"]]
                if not extra:
                    continue
                gsd = pr.get("geomean_sd") or []
                lines += ["", f"Geomean steps away from run {s['at']} ({plat}, {model}): "
                          f"{sum(r['geomean_elsewhere'] for r in extra)} in {len(extra)} of {len(ss)} seeds (at "
                          + "; ".join(str([g["position"] for g in r["geomean_steps"]]) for r in extra) + "). "
                          "The geometric mean's interval is read from the cases' intervals, and the measured runs "
                          "the series are made from give it different widths (sd "
                          + ", ".join(_pct(x) for x in gsd) + " for the templates taken in turn), while the runs "
                          f"move alike whichever template (common shift sd {_pct(pr['sd_common'])}): points of the "
                          "narrow template weigh more than their real scatter allows, and the between-run part "
                          "(the successive differences less the median interval) reads about zero."]
    sp = res.get("speed")
    if sp:
        lines += ["", "## Speed of `history show`", "",
                  f"{sp['runs']:,} runs x {sp['cases']} cases (synthetic rows without samples, one device, a 3% "
                  f"step two thirds in), added with one `Store.add`; goal < {sp['goal_s']:.0f} s on this 2-core "
                  "machine (others' jobs beside it).", "",
                  "| store | add | points() | analyse | show_lines | total (median, max) | CLI `history show` (median) |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for name, r in sp["stores"].items():
            med = {k: float(np.median([p[k] for p in r["reps"]])) for k in ("points_s", "analyse_s", "show_lines_s")}
            cli = (f"{r['cli']['median_s']:.2f} s (rc {r['cli']['rc']}; interpreter + import "
                   f"{r['cli']['interpreter_and_import_s']:.2f} s)" if r.get("cli") else
                   "not timed: `flyexplore/cli/history.py` was not there yet")
            lines.append(f"| {name} | {r['add_s']:.1f} s ({r['index_mb']:.0f} MB index) | {med['points_s']:.2f} s | "
                         f"{med['analyse_s']:.2f} s | {med['show_lines_s']:.2f} s | {r['median_total_s']:.2f} s, "
                         f"{r['max_total_s']:.2f} s | {cli} |")
    lines += ["", f"Made by `{prov.get('command', 'python ' + SCRIPT + ' run OUT')}`."]
    return lines


WHY = [
    "Why these noise models. The three H200 runs were made minutes apart on one machine, each a median over 3 "
    "fresh processes (`--processes 3`): `measured` is the spread of such runs, kept as measured (its tail "
    "included: the 8192^3 rows moved 2%), with the common shift the runs showed. A history of nightly runs over "
    "weeks moves more (clocks, drivers, neighbours); `calibration` is the spread between single processes of "
    "different runs (calibration.json, p95 3.3%), a harder case. On the CPU the two measured runs (3 processes "
    "each) are all there is; their common shift (one run 5.8% faster overall) is read as a per-run shift with "
    "one degree of freedom. Each series' intervals are the measured runs' own, scaled: on the CPU they are "
    "wide (median 95% half-width ~30% in log space) against a run-to-run spread of a few percent.",
]


def run(out: Path, only: str | None, seeds: int, speed_runs: int, speed_cases: int, reps: int) -> None:
    from flyexplore.world.env import write_provenance

    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    res = json.loads(path.read_text()) if path.exists() and only else {}
    cmd = "python " + " ".join([SCRIPT, *sys.argv[1:]])
    if only in (None, "steps"):
        res["steps"] = steps_part(seeds)
    if only in (None, "speed"):
        res["speed"] = speed_part(speed_runs, speed_cases, reps)
    write_provenance(out, SCRIPT, name="provenance.json", extra={"command": cmd, "only": only})
    path.write_text(json.dumps(res, indent=1) + "\n")
    text = summary(out)
    (out / "summary.md").write_text("\n".join(text) + "\n")
    print("\n".join(text))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("out", type=Path)
    r.add_argument("--only", choices=("steps", "speed"))
    r.add_argument("--seeds", type=int, default=20)
    r.add_argument("--speed-runs", type=int, default=1000)
    r.add_argument("--speed-cases", type=int, default=100)
    r.add_argument("--reps", type=int, default=3, help="timings of history show per store")
    s = sub.add_parser("summary")
    s.add_argument("out", type=Path)
    args = ap.parse_args()
    if args.cmd == "run":
        run(args.out, args.only, args.seeds, args.speed_runs, args.speed_cases, args.reps)
    else:
        (args.out / "summary.md").write_text("\n".join(summary(args.out)) + "\n")


if __name__ == "__main__":
    main()
