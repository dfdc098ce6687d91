"""Passes in fresh workers, one loop for all of them (:func:`pass_loop`, :class:`PassRule`):
``--processes N`` -- each case of a sweep measured in N fresh worker processes, and the N
measurements of one row combined into one row whose interval covers what another run sees -- and
an environment A/B's pairs of workers (:mod:`flyexplore.run.envab`: ``--pairs K``, or ``--pairs
auto``, pairs until every label is decided).

Why: within one process a row's interval is narrow (about +-0.3% for a GEMM on an H200), but a
fresh process reads another time -- another clock regime under the power limit, another autotune
choice; where the inputs lie moves it far less (``data/h200/process_spread/``) -- and ratios
moved up to 4% between processes while each run's interval was +-0.3% (issue 24; the figures of
``data/h200/reproducible/``). So the variation between processes is
measured, not assumed (pyperf's lesson: a benchmark is several processes, each several values).

How (:func:`flyexplore.run.sweep.run_sweep` with ``processes`` >= 2): the sweep runs its case list
N times (*passes*), each pass in newly started worker processes, the case order rotated by
``pass * cases / N`` (:func:`rotated`), so that each case is measured at N different points of
the sweep, after different neighbours. The N rows of one (case, dtype) are then
combined (:func:`combine`): per-process estimates kept in ``process_estimates``, the headline
time and speedup are their geometric means, and the intervals are
:func:`flyexplore.measure.stats.between_process` prediction intervals (within- and between-process
variation together). Each pass's rows are committed to the journal as they come (its ``passes``
table, :mod:`flyexplore.run.journal`) and a case's rows are combined when its last pass is in; a sweep that
is stopped, interrupted or killed keeps its pass rows there, and ``--resume`` runs only the passes
still missing (without an output file, a stopped sweep combines what it has, labelled with the
number of processes that measured it). Past :data:`flyexplore.run.spec.MAX_PASSES` processes a
sweep needs ``force``.
"""
from __future__ import annotations

import json
import math
import re
from typing import Callable, Sequence

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


def intervals(per: Sequence[dict], platform: str | None, band: float = S.BAND, kind: str = "processes",
              confidence: float = S.CONFIDENCE) -> dict:
    """The combined row's time and speedup from its per-process estimates ``per`` (dicts with
    ``time_ms``, ``time_se``, ``speedup``, ``speedup_se``, as in ``process_estimates``; None or
    NaN where missing): ``time_ms``, ``time_ci_lo_ms``, ``time_ci_hi_ms`` and, when every
    process has a speedup, ``speedup``, ``speedup_lo``, ``speedup_hi`` and ``verdict`` (with
    ``band``). Geometric means with :func:`flyexplore.measure.stats.between_process` prediction
    intervals, the run shift of ``platform`` added (:data:`flyexplore.results.table.RUN_SHIFT`,
    :data:`~flyexplore.results.table.RUN_SHIFT_PER_SD`). ``kind="pairs"`` (an environment A/B's
    pairs): the speedup's interval is the 95% interval of the mean over the pairs, no run shift
    (each pair's ratio is paired round by round, so what moves a whole run cancels in it); the
    time's stays a prediction interval of another run. ``confidence``: the speedup's (default 95%;
    ``--pairs auto`` reads its labels at :meth:`PairRule.confidence`, the error rate spread over its
    looks). Fewer than :data:`SPREAD_PAIRS` estimates have no spread between processes to read: the
    speedup's interval is then widened by the device's per-process floor (:func:`floor_for`), and
    one estimate gets that interval (issue 45). The time needs two or more estimates for an
    interval (NaN bounds otherwise). Raises ``ValueError`` for an unknown ``kind``."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r} (valid: {', '.join(KINDS)})")
    kw = {"shift": R.run_shift(platform), "shift_per_sd": R.run_shift_per_sd(platform)}
    t, tlo, thi = S.between_process([_num(p.get("time_ms")) for p in per], [_num(p.get("time_se")) for p in per], **kw)
    out = {"time_ms": t, "time_ci_lo_ms": tlo, "time_ci_hi_ms": thi}
    sps = [_num(p.get("speedup")) for p in per]
    if all(math.isfinite(s) for s in sps):
        skw = kw if kind == "processes" else {"prediction": False}
        e, lo, hi = S.between_process(sps, [_num(p.get("speedup_se")) for p in per], confidence=confidence,
                                      floor=floor_for(len(per), platform), **skw)
        out.update(speedup=e, speedup_lo=lo, speedup_hi=hi, verdict=S.verdict(lo, hi, band))
    return out


#: How many pairs (or processes) a row needs to read the spread between them: below it, its
#: speedup's interval is widened by the device's per-process floor (:func:`floor_for`).
SPREAD_PAIRS = 3


def floor_for(n: int, platform: str | None) -> float:
    """The per-process floor (log space) that a row combined from ``n`` pairs or processes gets:
    :func:`flyexplore.results.speedups.process_floor` of ``platform`` below :data:`SPREAD_PAIRS`,
    else 0 (three or more read the spread between them; issue 45)."""
    return R.process_floor(platform) if n < SPREAD_PAIRS else 0.0


def _num(v) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f


def combine(rows: Sequence[dict], wanted: int, band: float = S.BAND, platform: str | None = None,
            kind: str = "processes", confidence: float = S.CONFIDENCE) -> dict:
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

    ``confidence``: of the speedup's interval (:func:`intervals`).

    With one ok row the row keeps its time's interval, its speedup's widened by the device's
    per-process floor (:func:`floor_for`), with ``processes`` = 1 (and a note when ``wanted`` > 1).
    Raises ``ValueError`` for an empty ``rows``."""
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
        # one pair (or process): its own interval knows nothing of the spread between processes,
        # so the speedup's is widened by the device's stated per-process floor (issue 45)
        got = intervals(per, platform, band, kind, confidence)
        if "speedup" in got and math.isfinite(got["speedup_lo"]):
            out.update(speedup_lo=got["speedup_lo"], speedup_hi=got["speedup_hi"], verdict=got["verdict"])
            out["ci_method"] = (f"one {unit} ({_pct(confidence)} interval of its own rounds, widened by the "
                                f"{platform or 'cpu'} per-process floor of {R.process_floor(platform):.0%}: a label "
                                f"needs a difference that one fresh {unit} cannot explain)")
        if wanted > 1:
            _note(out, f"measured in 1 of {wanted} {units}: the speedup's interval is that {unit}'s own, widened by "
                       "the per-process floor")
        return out
    how = (f"between-pair ({len(ok)} pairs of workers; speedup: {_pct(confidence)} interval of the mean over the "
           "pairs, each paired round by round; time: prediction interval of another run)" if kind == "pairs" else
           f"between-process ({len(ok)} processes; prediction interval of another run)")
    if floor_for(len(ok), platform):
        how = (how[:-1] + f"; the speedup's never narrower than the {platform or 'cpu'} per-process floor of "
               f"{R.process_floor(platform):.0%}: fewer than {SPREAD_PAIRS} cannot show their spread)")
    out.update(intervals(per, platform, band, kind, confidence), ci_method=how)
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


def _pct(confidence: float) -> str:
    return f"{confidence * 100:.3f}".rstrip("0").rstrip(".") + "%"


# -- pairs until decided ------------------------------------------------------------------------------

#: How a case of ``--pairs auto`` stopped taking pairs (the row's ``pairs_stop``): every label
#: decided (FASTER / SAME / SLOWER), or AMBIGUOUS but settled (its interval within +-band/2: the
#: effect sits at a band edge); ``max_pairs``: the cap; ``unreachable``: the spread seen would need
#: more pairs than the cap allows (more pairs would not decide it); ``fixed``: ``--pairs N``.
PAIR_STOPS = ("decided", "max_pairs", "unreachable", "fixed")


class PassRule:
    """When a case takes another pass of fresh workers -- an environment A/B's pair, or a
    ``--processes`` process -- and how its passes are combined (:func:`combine`, ``kind``).

    ``first`` pairs for every case (``--pairs N``, or :data:`flyexplore.run.envs.PAIRS` = 3 for
    ``--pairs auto``); with ``auto``, after each pair from the ``first``-th on, the case's arms are
    combined (:func:`combine`, ``kind="pairs"``) and another pair runs while any speedup's label
    is AMBIGUOUS and not settled (its interval wider than +-``band``/2), up to ``most`` pairs
    (``--max-pairs``), or until the spread seen says that even ``most`` pairs would not decide it
    (:func:`flyexplore.measure.stats.pairs_to_decide` of the per-pair estimates and the reading).

    The correction for looking again and again: a weighted Bonferroni split of the 5% error rate
    over the looks (alpha spending). A case is looked at after pair ``first``, ``first + 1``, ...,
    ``most`` -- ``L = most - first + 1`` looks; the first look reads its labels at ``1 - 0.05 / 2``
    (97.5%) and each later one at ``1 - 0.05 / (2 (L - 1))`` (with the defaults 3 and 10: 97.5%,
    then 99.643% for each of the 7 others), so that the chance of any wrong label over all the
    looks stays within the 5% the reported 95% interval promises (the union bound: the looks'
    error rates add up to 5%; conservative, since the looks share pairs). Half goes to the first
    look because most cases are decided there: with three pairs (t(2)) an even split would need
    t = 12.6 where 6.2 does. The row's interval is the one its label was read from, at its look's
    confidence (:meth:`confidence_at`; its ``ci_method`` says so). A fixed ``--pairs N`` has one
    look, at 95%, as before."""

    def __init__(self, first: int, most: int, band: float, platform: str | None, auto: bool = True,
                 kind: str = "pairs"):
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r} (valid: {', '.join(KINDS)})")
        self.first, self.auto, self.band, self.platform = int(first), bool(auto), float(band), platform
        self.kind = kind
        self.most = max(int(most), self.first) if auto else self.first
        self.looks = self.most - self.first + 1

    def confidence_at(self, n: int) -> float:
        """The confidence of the look after ``n`` pairs (see the class text)."""
        alpha = 1 - S.CONFIDENCE
        if self.looks <= 1:
            return S.CONFIDENCE
        return 1 - (alpha / 2 if n <= self.first else alpha / (2 * (self.looks - 1)))

    @property
    def confidence(self) -> float:
        """The confidence of the last look (the strictest): what a row combined outside the
        rule's own loop (a stopped sweep's rows) is read at."""
        return self.confidence_at(self.most)

    def text(self) -> str:
        """The pairs as a progress bar says them: ``3`` or ``3-10 auto``."""
        return f"{self.first}-{self.most} auto" if self.auto and self.most > self.first else str(self.first)

    @staticmethod
    def done(got: dict, arms) -> int:
        """How many passes in a row, from the first, ``got`` (``{pass: {arm: row}}``) holds for every arm."""
        n = 0
        while n in got and all(a in got[n] for a in arms):
            n += 1
        return n

    def combined(self, got: dict, arms) -> dict:
        """``{arm: row}`` combined over the passes ``got`` holds in a row (:meth:`done`)."""
        n = self.done(got, arms)
        out = {}
        for a in arms:
            rows = [got[k][a] for k in range(n) if a in got.get(k, {})]
            if rows:
                out[a] = combine(rows, n, self.band, self.platform, kind=self.kind, confidence=self.confidence_at(n))
        return out

    def _undecided(self, row: dict) -> bool:
        lo, hi = _num(row.get("speedup_lo")), _num(row.get("speedup_hi"))
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return False      # no interval (a failed arm, the baseline): more pairs do not decide it
        if S.verdict(lo, hi, self.band) != "AMBIGUOUS":
            return False
        est = _num(row.get("speedup"))
        return not (est > 0 and max(hi / est - 1, 1 - lo / est) <= self.band / 2)

    def _needed(self, row: dict, estimate: bool) -> int | float | None:
        per = R.process_estimates(row.get("process_estimates")) if row.get("process_estimates") else []
        sd = S.pair_spread([p.get("speedup") for p in per], [p.get("speedup_se") for p in per]) if per else math.nan
        if per and len(per) < SPREAD_PAIRS:   # no spread between pairs to read yet: the device's floor stands for it
            sd = max(sd, R.process_floor(self.platform)) if math.isfinite(sd) else R.process_floor(self.platform)
        est = _num(row.get("speedup")) if estimate else None
        return S.pairs_to_decide(sd, self.band, est, confidence=self.confidence)

    def _state(self, got: dict, arms) -> tuple[str | None, dict]:
        """``(why the case takes no more pairs, or None; its rows combined so far)``."""
        n = self.done(got, arms)
        if n < self.first:
            return None, {}
        rows = self.combined(got, arms)
        if not self.auto:
            return "fixed", rows
        open_ = [r for r in rows.values() if self._undecided(r)]
        if not open_:
            return "decided", rows
        if n >= self.most:
            return "max_pairs", rows
        if any(x is not None and x > self.most for x in (self._needed(r, True) for r in open_)):
            return "unreachable", rows
        return None, rows

    def stop(self, got: dict, arms) -> str | None:
        """Why the case takes no more pairs (:data:`PAIR_STOPS`), or None when it wants another."""
        return self._state(got, arms)[0]

    def wants(self, got: dict, arms) -> bool:
        """Whether the case of ``got`` wants another pass."""
        return self.stop(got, arms) is None

    def final_rows(self, got: dict, arms) -> dict:
        """The case's rows combined over its passes, each with ``pairs_stop`` and, where its label
        is AMBIGUOUS, ``pairs_needed``: how many pairs the observed spread would need to decide a
        change of the band's size (:func:`flyexplore.measure.stats.pairs_to_decide`), said in its
        message too."""
        why, out = self._state(got, arms)
        why = why or "stopped"
        if not out:   # fewer passes than the first look (a stopped run): combined as they are
            out = self.combined(got, arms)
        for row in out.values() if self.kind == "pairs" else ():
            row["pairs_stop"] = why
            if row.get("verdict") == "AMBIGUOUS":
                need = self._needed(row, False)
                row["pairs_needed"] = float(need) if need is not None else None
                n = int(row.get("processes") or 0)
                if need is not None and math.isfinite(need):
                    whose = ("the spread between pairs" if n >= SPREAD_PAIRS else
                             f"the device's per-process floor ({R.process_floor(self.platform):.0%}; fewer than "
                             f"{SPREAD_PAIRS} pairs cannot show their spread)")
                    _note(row, f"AMBIGUOUS after {n} pair{'s' if n != 1 else ''} ({why}): {whose} "
                               f"would need about {int(need)} pairs to decide a change of {self.band:.0%}")
                elif need is not None:
                    _note(row, f"AMBIGUOUS after {n} pairs ({why}): no number of pairs decides it at this band")
        return out


def pass_loop(keys: Sequence, rule: PassRule, have: dict, arms: Callable, run_pass: Callable, finalize: Callable,
              should_stop: Callable | None = None) -> list[str]:
    """The one loop of passes in fresh workers, for ``--processes`` and an environment A/B's pairs.

    ``keys``: the plan's ``(case label, dtype)`` in order; ``have``: ``{key: {pass: {arm: row}}}``,
    the pass rows so far (a resume's from the journal), which ``run_pass`` adds to; ``arms(key)``:
    the arms a pass of ``key`` must hold; ``rule``: a :class:`PassRule`. Pass ``k`` (0-based, at most
    ``rule.most``) takes, in the order rotated by ``k`` (:func:`rotated`), the keys holding ``k``
    passes that want another (:meth:`PassRule.wants`): ``run_pass(k, todo, close)`` runs them in
    fresh workers and calls ``close(key)`` when a key's pass rows are in; it returns ``(problems,
    stopped)``. A key that wants no more passes is handed to ``finalize(key)`` once (a resume's keys
    at the start). ``should_stop()`` is read before each pass. Returns the problems, one line each."""
    final: set = set()

    def close(key) -> None:
        got = have.get(key, {})
        if key not in final and rule.done(got, arms(key)) and not rule.wants(got, arms(key)):
            final.add(key)
            finalize(key)

    for key in keys:
        close(key)
    problems: list[str] = []
    for k in range(rule.most):
        todo = [key for key in rotated(keys, rule.most, k)
                if key not in final and rule.done(have.get(key, {}), arms(key)) == k]
        if not todo:
            continue
        if should_stop is not None and should_stop():
            break
        got, stopped = run_pass(k, todo, close)
        problems += list(got or ())
        if stopped:
            break
    return problems
