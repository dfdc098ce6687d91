"""``--processes N``: each case of a sweep measured in N fresh worker processes, and the N
measurements of one row combined into one row whose interval covers what another run sees.

Why: within one process a row's interval is narrow (about +-0.3% for a GEMM on an H200), but a
fresh process reads another time -- another clock regime under the power limit, another autotune
choice; where the inputs lie moves it far less (``data/h200/process_spread/``) -- and ratios
moved up to 4% between processes while each run's interval was +-0.3% (issue 24; the figures of
``data/h200/reproducible/``). So the variation between processes is
measured, not assumed (pyperf's lesson: a benchmark is several processes, each several values).

How (:func:`flyexplore.run.sweep.run_sweep` with ``processes`` >= 2): the sweep runs its case list
N times (*passes*), each pass in newly started worker processes, the case order rotated by
``pass * cases / N`` (:func:`rotated`), so that each case is measured at N different points of
the sweep, after different neighbours. The N rows of one (case, dtype, backend) are then
combined (:func:`combine`): per-process estimates kept in ``process_estimates``, the headline
time and speedup are their geometric means, and the intervals are
:func:`flyexplore.measure.stats.between_process` prediction intervals (within- and between-process
variation together). Each pass's rows are committed to the journal as they come (its ``passes``
table, :mod:`flyexplore.run.journal`) and a row is combined when its last pass is in; a sweep that
is stopped, interrupted or killed keeps its pass rows there, and ``--resume`` runs only the passes
still missing (without an output file, a stopped sweep combines what it has, labelled with the
number of processes that measured it). Past :data:`flyexplore.run.spec.MAX_PASSES` processes a
sweep needs ``force``.
"""
from __future__ import annotations

import json
import math
import re
from typing import Sequence

import numpy as np

from flyexplore.measure import stats as S
from flyexplore.results import table as R

#: Columns taken from the first process's row as they are (what ran, errors, device): the
#: measured numbers are recomputed by :func:`combine`.
_TIMES = ("time_iqr_ms", "time_p20_ms", "time_p80_ms", "time_min_ms", "time_mean_ms")


def rotated(items: Sequence, n: int, k: int) -> list:
    """The order of pass ``k`` (0-based) of ``n``: ``items`` rotated left by ``k * len / n``
    (rounded down), so that every pass starts at another point of the case list."""
    items = list(items)
    if not items or n <= 1:
        return items
    s = (k * len(items)) // n
    return items[s:] + items[:s]


#: How :func:`combine` reads the measurements of one row: ``processes`` (``sweep --processes``:
#: prediction intervals of another run) or ``pairs`` (an environment A/B's fresh pairs of workers,
#: :mod:`flyexplore.run.envab`: the speedup's interval is that of the mean over the pairs).
KINDS = ("processes", "pairs")


def intervals(per: Sequence[dict], platform: str | None, band: float = S.BAND, kind: str = "processes") -> dict:
    """The combined row's time and speedup from its per-process estimates ``per`` (dicts with
    ``time_ms``, ``time_se``, ``speedup``, ``speedup_se``, as in ``process_estimates``; None or
    NaN where missing): ``time_ms``, ``time_ci_lo_ms``, ``time_ci_hi_ms`` and, when every
    process has a speedup, ``speedup``, ``speedup_lo``, ``speedup_hi`` and ``verdict`` (with
    ``band``). Geometric means with :func:`flyexplore.measure.stats.between_process` prediction
    intervals, the run shift of ``platform`` added (:data:`flyexplore.results.table.RUN_SHIFT`,
    :data:`~flyexplore.results.table.RUN_SHIFT_PER_SD`). ``kind="pairs"`` (an environment A/B's
    pairs): the speedup's interval is the 95% interval of the mean over the pairs, no run shift
    (each pair's ratio is paired round by round, so what moves a whole run cancels in it); the
    time's stays a prediction interval of another run. Needs two or more estimates for an
    interval (NaN bounds otherwise). Raises ``ValueError`` for an unknown ``kind``."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r} (valid: {', '.join(KINDS)})")
    kw = {"shift": R.run_shift(platform), "shift_per_sd": R.run_shift_per_sd(platform)}
    t, tlo, thi = S.between_process([_num(p.get("time_ms")) for p in per], [_num(p.get("time_se")) for p in per], **kw)
    out = {"time_ms": t, "time_ci_lo_ms": tlo, "time_ci_hi_ms": thi}
    sps = [_num(p.get("speedup")) for p in per]
    if all(math.isfinite(s) for s in sps):
        skw = kw if kind == "processes" else {"prediction": False}
        e, lo, hi = S.between_process(sps, [_num(p.get("speedup_se")) for p in per], **skw)
        out.update(speedup=e, speedup_lo=lo, speedup_hi=hi, verdict=S.verdict(lo, hi, band))
    return out


def _num(v) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f


def combine(rows: Sequence[dict], wanted: int, band: float = S.BAND, platform: str | None = None,
            kind: str = "processes") -> dict:
    """One row from the rows of one (case, dtype, backend) measured in several fresh processes.

    ``rows``: the row columns of each process, in pass order (as :func:`flyexplore.run.cases.run_case`
    yields them, with ``worker``/``device_id`` added); ``wanted``: the number of processes asked
    for (``--processes``); ``band``: the SAME band of the label; ``platform`` (cuda, rocm, cpu)
    picks the run-wide shift added to every interval (:data:`flyexplore.results.table.RUN_SHIFT`,
    and :data:`~flyexplore.results.table.RUN_SHIFT_PER_SD` in proportion to the spread).

    - No ``ok`` row: the first row is returned (its failure), with a note of how many processes
      failed alike.
    - Otherwise the ``ok`` rows are combined: ``time_ms`` is the geometric mean of the per-process
      medians (ms) and ``time_ci_lo_ms``/``time_ci_hi_ms`` the 95% prediction interval of another
      run of as many processes (:func:`flyexplore.measure.stats.between_process`); ``speedup``,
      ``speedup_lo``/``speedup_hi`` and ``verdict`` likewise from the per-process paired speedups.
      ``process_estimates`` (JSON) keeps each process's ``time_ms``, ``time_se`` (its own log
      standard error), ``speedup``, ``speedup_se``, ``rounds``, ``wall_s``, ``verdict_s``,
      ``clock_mhz_min``, ``stop_reason`` and ``worker``; ``processes`` is the number combined. ``samples_ms`` holds
      every process's rounds, in pass order (so the rows of one case still pair round by round);
      ``rounds``, ``n_samples``, ``wall_s`` are sums, ``converged``, ``accuracy_ok``,
      ``recheck_ok`` hold for all, the clock minimum is the lowest. ``ci_method`` says
      ``between-process``. Processes that failed are named in ``message``.

    ``kind``: ``processes`` or ``pairs`` (an environment A/B's fresh pairs of workers:
    :func:`intervals`' rule for them; ``processes`` then counts the pairs, ``ci_method`` says
    ``between-pair``, and the cross-environment check holds for all pairs, its difference the
    largest).

    With one ok row and ``wanted`` > 1 the row keeps its own interval, with ``processes`` = 1 and
    a note. Raises ``ValueError`` for an empty ``rows``."""
    if not rows:
        raise ValueError("combine needs the rows of at least one process")
    ok = [r for r in rows if r.get("status") == "ok" and _num(r.get("time_ms")) > 0]
    bad = [r for r in rows if r not in ok]
    unit = "pair" if kind == "pairs" else "process"
    if not ok:
        out = dict(rows[0])
        if len(rows) > 1:
            _note(out, f"{len(rows)} of {wanted} {unit}{'es' if unit == 'process' else 's'} gave no time")
        out["processes"] = 0
        return out
    out = dict(ok[0])
    per = []
    for r in ok:
        t, lo, hi = _num(r.get("time_ms")), _num(r.get("time_ci_lo_ms")), _num(r.get("time_ci_hi_ms"))
        sp, slo, shi = _num(r.get("speedup")), _num(r.get("speedup_lo")), _num(r.get("speedup_hi"))
        per.append({"time_ms": t, "time_se": S.log_se(lo, hi), "speedup": sp, "speedup_se": S.log_se(slo, shi),
                    "rounds": r.get("rounds"), "wall_s": _num(r.get("wall_s")), "verdict_s": _num(r.get("verdict_s")),
                    "clock_mhz_min": _num(r.get("clock_mhz_min")), "stop_reason": r.get("stop_reason"),
                    "worker": r.get("worker")})
    out["message"] = _notes([r.get("message") for r in ok], "pair" if kind == "pairs" else "process")
    out["processes"] = len(ok)
    out["process_estimates"] = json.dumps([{k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                                            for k, v in p.items()} for p in per])
    units = "pairs" if kind == "pairs" else "processes"
    if bad:
        _note(out, f"{len(bad)} of {wanted} {units} failed ({', '.join(sorted({str(b.get('status')) for b in bad}))}: "
                   f"{bad[0].get('message') or 'no message'}); combined over {len(ok)}")
    if kind == "pairs":
        oks = [r.get("cross_env_ok") for r in ok]
        if any(x is not None for x in oks):
            out["cross_env_ok"] = False if any(x is False for x in oks) else True
            errs = [_num(r.get("cross_env_err_rel")) for r in ok]
            errs = [e for e in errs if math.isfinite(e)]
            out["cross_env_err_rel"] = max(errs) if errs else None
        over = sorted(_num(r.get("turn_overhead_ms")) for r in ok if math.isfinite(_num(r.get("turn_overhead_ms"))))
        out["turn_overhead_ms"] = over[len(over) // 2] if over else None
        digests = list(dict.fromkeys(str(r.get("inputs_digest")) for r in ok if r.get("inputs_digest")))
        out["inputs_digest"] = digests[0] if len(digests) == 1 else ("differ: " + ", ".join(digests)) if digests else None
    if len(ok) < 2:
        if wanted > 1:
            _note(out, f"measured in 1 of {wanted} {units}: the interval is that {unit}'s own")
        return out
    how = (f"between-pair ({len(ok)} pairs of workers; speedup: 95% interval of the mean over the pairs, each "
           "paired round by round; time: prediction interval of another run)" if kind == "pairs" else
           f"between-process ({len(ok)} processes; prediction interval of another run)")
    out.update(intervals(per, platform, band, kind), ci_method=how)
    rounds = [rr for r in ok for rr in R.json_list(r.get("samples_ms"))]
    if rounds:
        out["samples_ms"] = json.dumps(rounds, separators=(",", ":"))
        v = np.asarray([x for rr in rounds for x in rr], dtype=float)
        v = v[np.isfinite(v)]
        if v.size:
            q20, q25, q75, q80 = np.percentile(v, [20, 25, 75, 80])
            out.update(time_iqr_ms=float(q75 - q25), time_p20_ms=float(q20), time_p80_ms=float(q80),
                       time_min_ms=float(v.min()), time_mean_ms=float(v.mean()))
    clocks = [c for r in ok for c in R.json_list(r.get("round_clock_mhz"))]
    out["round_clock_mhz"] = json.dumps(clocks) if any(c is not None for c in clocks) else None
    for k in ("rounds", "n_samples"):
        vals = [r.get(k) for r in ok]
        out[k] = int(sum(int(x) for x in vals)) if all(x is not None for x in vals) else None
    out["wall_s"] = float(np.nansum([p["wall_s"] for p in per]))
    reasons = [str(p["stop_reason"]) for p in per if p.get("stop_reason")]
    out["stop_reason"] = ",".join(dict.fromkeys(reasons)) or out.get("stop_reason")
    vs = [p["verdict_s"] for p in per if math.isfinite(p["verdict_s"])]
    out["verdict_s"] = max(vs) if len(vs) == len(per) else None
    cmin = [p["clock_mhz_min"] for p in per if math.isfinite(p["clock_mhz_min"])]
    out["clock_mhz_min"] = min(cmin) if cmin else out.get("clock_mhz_min")
    for k in ("converged", "accuracy_ok", "recheck_ok"):   # true only when true in every process
        vals = [r.get(k) for r in ok]
        out[k] = False if any(x is False for x in vals) else None if any(x is None for x in vals) else True
    for k in ("throttled", "noisy", "host_bound"):          # true when true in any process
        if any(r.get(k) is True for r in ok):
            out[k] = True
    workers = [str(p["worker"]) for p in per if p["worker"]]
    if workers:
        out["worker"] = ",".join(dict.fromkeys(workers))
    sec = out["time_ms"] * 1e-3
    for col, key in (("tflops", "flops"), ("gbps", "bytes")):
        amount = _num(out.get(key))
        div = 1e12 if col == "tflops" else 1e9
        out[col] = amount / sec / div if amount > 0 and sec > 0 else None
    return out


_UNCONVERGED = re.compile(r"^unconverged after \d+ rounds: (.*)$")


def _notes(messages, unit: str = "pair") -> str | None:
    """The notes of an environment A/B's pairs (or of ``--processes``' passes, ``unit`` "process")
    as one message: each distinct note once however many rows carry it (a stopped sweep's rows all
    say why), and the ones that stopped before their target in one note naming each one's reason
    (``unconverged in 2 of 3 pairs (pair 1: a label still undecided; pair 3: case budget ran
    out)``; the rounds of each are in ``process_estimates``)."""
    notes, unconv = [], []
    for k, m in enumerate(messages, 1):
        for part in str(m or "").split("; "):
            hit = _UNCONVERGED.match(part.strip())
            if hit:
                unconv.append(f"{unit} {k}: {hit.group(1)}")
            elif part.strip():
                notes.append(part.strip())
    out = list(dict.fromkeys(notes))
    if unconv:
        units = "processes" if unit == "process" else f"{unit}s"
        out.append(f"unconverged in {len(unconv)} of {len(messages)} {units} ({'; '.join(unconv)})")
    return "; ".join(out) or None


def _note(row: dict, text: str) -> None:
    row["message"] = f"{row['message']}; {text}" if row.get("message") else text
