"""The CI gate of an A/B (``flyexplore compare --fail-on``, ``ab.gate(...)``): its rules, read
from ``--fail-on`` text (:class:`FailOn`, :func:`parse_fail_on`, :func:`parse_rules`), each
rule's result (:class:`RuleResult`), the whole outcome (:class:`GateResult`) and :func:`gate`,
which judges the pairs of an A/B (:class:`flyexplore.results.compare.ABResult`, or the
:class:`flyexplore.results.compare.Sides` of :func:`flyexplore.results.compare.sides`).

SLOWER: B slower than A beyond a threshold fails. AMBIGUOUS: an undecided interval wider than a
width fails or, with ``:warn``, warns, saying how many pairs of workers would decide it (the
pairs-needed rule, :func:`flyexplore.measure.stats.pairs_to_decide`). The summaries of
:mod:`flyexplore.results.compare` print the gate's outcome (:attr:`GateResult.lines`,
:meth:`GateResult.as_dict`); both use the per-pair text of :mod:`flyexplore.results.pairtext`.
This module imports neither :mod:`flyexplore.results.compare` nor the A/B's classes: it reads an
A/B's ``pairs``, ``geomean_ci``, ``names`` and ``key`` (and a ``Sides``' ``kind`` and ``ab``).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd

from flyexplore.errors import UsageError
from flyexplore.measure import stats as S
from flyexplore.results.pairtext import TOP, _case_lines, _geomean_label, _missing, _pair_records, _pct, _wrap, jsonable

#: Labels the gate (``--fail-on``) accepts: SLOWER (B slower than A beyond a threshold) and
#: AMBIGUOUS (an undecided interval wider than a width; :class:`FailOn`).
GATE_LABELS = ("SLOWER", "AMBIGUOUS")
#: The last part of a rule that warns instead of failing (``AMBIGUOUS:5%:warn``).
WARN = "warn"


@dataclass(frozen=True)
class FailOn:
    """One gate rule (``--fail-on``; several, comma-separated, are read by :func:`parse_rules`).

    ``label`` SLOWER: a pair, or the geometric mean, labelled SLOWER (B slower) trips it when its
    interval's upper end is below ``1 / (1 + threshold)``, i.e. B is slower by more than
    ``threshold`` (a fraction: 0.05 = 5%) even at the interval's most favourable end; 0: any
    SLOWER trips it.

    ``label`` AMBIGUOUS: a pair, or the geometric mean, labelled AMBIGUOUS trips it when its 95%
    interval is wider than ``threshold``: its **width** ``hi / lo - 1`` (a fraction: the upper
    end over the lower end, minus 1; the same for a ratio and its inverse) is above
    ``threshold``, or it has no finite interval; 0: any AMBIGUOUS trips it. An interval of width
    ``w`` cannot tell a change of ``w`` from none, so ``AMBIGUOUS:5%`` fails a reading that
    cannot tell a 5% change.

    ``warn``: a tripped rule warns (the gate says WARNING and names what tripped it; ``flyexplore
    compare`` exits 0) instead of failing."""

    label: str = "SLOWER"
    threshold: float = 0.0
    warn: bool = False

    @property
    def limit(self) -> float:
        """SLOWER: ``1 / (1 + threshold)``, a ratio (time A / time B) whose interval lies wholly
        below it trips the rule. AMBIGUOUS: ``1 + threshold``, the largest ``hi / lo`` that
        passes."""
        return 1.0 / (1.0 + self.threshold) if self.label == "SLOWER" else 1.0 + self.threshold

    @property
    def text(self) -> str:
        """The rule as ``--fail-on`` takes it: ``"SLOWER"``, ``"SLOWER:5%"``,
        ``"AMBIGUOUS:5%"``, ``"AMBIGUOUS:5%:warn"``."""
        t = self.label if self.threshold == 0 else f"{self.label}:{_pct(self.threshold)}"
        return f"{t}:{WARN}" if self.warn else t


_NUMBER = re.compile(r"^[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?$")

_HINT = ("(valid: SLOWER[:THRESHOLD] or AMBIGUOUS[:WIDTH], each with an optional :warn, comma-separated; "
         "THRESHOLD / WIDTH a percentage such as 5% or a fraction such as 0.05)")


def parse_fail_on(text: "str | FailOn") -> FailOn:
    """Read one ``--fail-on`` rule: ``LABEL[:AMOUNT][:warn]``. LABEL is ``SLOWER`` (AMOUNT: the
    slowdown threshold) or ``AMBIGUOUS`` (AMOUNT: the widest interval that passes, ``hi / lo -
    1``); AMOUNT a percentage (``5%``) or a fraction below 1 (``0.05``), default 0 (any pair
    with the label trips it); a bare number of 1 or more is refused as ambiguous (write
    ``150%``). ``:warn`` makes the rule warn instead of failing. Label and ``warn`` are read
    case-insensitively. Returns a :class:`FailOn` (a :class:`FailOn` is checked and returned as
    it is). Raises :class:`UsageError`, one line naming the bad value: another label (FASTER,
    SAME), an amount that is no number, negative or not finite, or too many ``:`` parts.
    Several rules: :func:`parse_rules`."""
    if isinstance(text, FailOn):
        if text.label not in GATE_LABELS or not (math.isfinite(text.threshold) and text.threshold >= 0):
            raise UsageError(f"bad --fail-on {text!r}: label must be SLOWER or AMBIGUOUS, threshold a fraction >= 0")
        return text
    raw = str(text)
    parts = raw.strip().split(":")
    warn = len(parts) >= 2 and parts[-1].strip().lower() == WARN
    if warn:
        parts = parts[:-1]
    label = parts[0].strip().upper()
    if label not in GATE_LABELS:
        raise UsageError(f"bad --fail-on {raw!r}: only SLOWER (B slower than A) and AMBIGUOUS (undecided) "
                         f"can gate {_HINT}")
    if len(parts) > 2:
        raise UsageError(f"bad --fail-on {raw!r}: too many ':' parts {_HINT}")
    if len(parts) == 1:
        return FailOn(label, 0.0, warn)
    what = "threshold" if label == "SLOWER" else "width"
    t = parts[1].strip()
    percent = t.endswith("%")
    num = t[:-1].strip() if percent else t
    if not _NUMBER.match(num):
        why = f"a negative {what}" if num.startswith("-") else f"the {what} is no number"
        raise UsageError(f"bad --fail-on {raw!r}: {why} {_HINT}")
    value = float(num) / 100 if percent else float(num)
    if not math.isfinite(value):
        raise UsageError(f"bad --fail-on {raw!r}: the {what} is not finite {_HINT}")
    if not percent and value >= 1:
        raise UsageError(f"bad --fail-on {raw!r}: a bare {what} is a fraction below 1; "
                         f"write {num}% for {num} percent, or {_pct(value)} for {value:g} as a fraction")
    return FailOn(label, value, warn)


def parse_rules(text: "str | FailOn | Sequence[str | FailOn]") -> tuple[FailOn, ...]:
    """Read a whole ``--fail-on`` value: one or more rules separated by commas
    (``SLOWER:5%,AMBIGUOUS:5%:warn``), each read by :func:`parse_fail_on`; a :class:`FailOn`
    or a list of rules (texts or :class:`FailOn`) is read alike. Returns the rules in order.
    Raises :class:`UsageError` naming the bad rule (and the whole value) as
    :func:`parse_fail_on`, or for an empty rule (``SLOWER:5%,``)."""
    if isinstance(text, FailOn):
        return (parse_fail_on(text),)
    if isinstance(text, str):
        items: list = text.split(",")
        whole = text
    else:
        items = list(text)
        whole = ",".join(x.text if isinstance(x, FailOn) else str(x) for x in items)
    if not items or all(isinstance(x, str) and not x.strip() for x in items):
        raise UsageError(f"bad --fail-on {whole!r}: no rule {_HINT}")
    out = []
    for x in items:
        if isinstance(x, str) and not x.strip():
            raise UsageError(f"bad --fail-on {whole!r}: an empty rule between commas {_HINT}")
        try:
            out.append(parse_fail_on(x))
        except UsageError as exc:
            if len(items) == 1:
                raise
            raise UsageError(f"{exc} in {whole!r}") from None
    return tuple(out)


@dataclass(frozen=True)
class RuleResult:
    """One rule's outcome in a :class:`GateResult`. ``rule``: the :class:`FailOn`;
    ``tripped``: the pairs that tripped it (the key columns, ``time_a_ms``, ``time_b_ms``,
    ``ratio``, ``ratio_lo``, ``ratio_hi``, ``verdict``; an AMBIGUOUS rule's also ``width``,
    ``hi / lo - 1``, ``worker_pairs`` and ``pair_sd``, the spread between the pairs of workers
    where the interval came from them (:func:`flyexplore.results.compare.pair`),
    ``pairs_to_decide``, the pairs of workers that would decide the label if its estimate held,
    and ``pairs_to_narrow``, the pairs that would bring its width within the rule's
    (:func:`flyexplore.measure.stats.pairs_to_decide`; NA without a spread, ``inf`` where no
    number would)): SLOWER's most slowed first, AMBIGUOUS's widest first; ``geomean_tripped``:
    whether the geometric mean tripped it; ``geomean_needs``: ``(pairs_to_decide,
    pairs_to_narrow)`` of the geometric mean (None where unknown); ``names``: the two sides'."""

    rule: FailOn
    tripped: pd.DataFrame
    geomean_tripped: bool
    geomean_needs: tuple = (None, None)
    names: tuple[str, str] = ("A", "B")

    @property
    def hit(self) -> bool:
        """True when a pair or the geometric mean tripped the rule."""
        return bool(len(self.tripped)) or self.geomean_tripped

    @property
    def reason(self) -> str:
        """What tripped the rule, or that nothing did, in one sentence (not wrapped); for
        AMBIGUOUS also what would decide it: about how many pairs of workers (the spread between
        pairs known) or a quieter machine or more rounds (not known)."""
        nb, r = self.names[1], self.rule
        if r.label == "SLOWER":
            rule = (f"{nb} slower by more than {_pct(r.threshold)} (interval's upper end "
                    f"below {r.limit:.3f}x)") if r.threshold > 0 else f"{nb} slower (SLOWER)"
        else:
            rule = (f"AMBIGUOUS with a 95% interval wider than {_pct(r.threshold)} (hi/lo - 1 above "
                    f"{r.threshold:.3g})") if r.threshold > 0 else "AMBIGUOUS"
        if not self.hit:
            return f"no pair, nor the geometric mean, is {rule}"
        n = len(self.tripped)
        what = [f"{n} pair{'s' if n != 1 else ''}"] if n else []
        if self.geomean_tripped:
            what.append("the geometric mean")
        one = what in (["1 pair"], ["the geometric mean"])
        out = f"{' and '.join(what)} {'is' if one else 'are'} {rule}"
        return out + ("; " + self._advice(one) if r.label == "AMBIGUOUS" else "")

    def _advice(self, one: bool) -> str:
        t = self.tripped
        dec = list(t["pairs_to_decide"]) if "pairs_to_decide" in t else [None] * len(t)
        nar = list(t["pairs_to_narrow"]) if "pairs_to_narrow" in t else [None] * len(t)
        if self.geomean_tripped:
            dec.append(self.geomean_needs[0])
            nar.append(self.geomean_needs[1])
        known = [d for d in dec if not _missing(d)]
        finite = [int(d) for d in known if math.isfinite(d)]
        it, up = ("it", "") if one else ("them", "up to ")
        parts = []
        if finite:
            most = max(finite)
            s = (f"at the spread between the pairs of workers, {up}about {most:,} pairs would decide {it} "
                 f"if {'its estimate' if one else 'the estimates'} held (sweep --pairs {most})")
            wide = [int(v) for v in nar if not _missing(v) and math.isfinite(v)]
            if wide and self.rule.threshold > 0:
                s += f", {up}about {max(wide):,} would bring {it} within {_pct(self.rule.threshold)}"
            parts.append(s)
        if len(known) > len(finite):
            parts.append("no number of pairs would decide an estimate that lies on a band edge")
        if len(known) < len(dec):
            k = len(dec) - len(known)
            parts.append(("it has" if one else f"{k} of them have" if k < len(dec) else "they have")
                         + " no spread between pairs of workers to count from: a quieter machine or more "
                         "rounds would narrow " + ("it" if one or k == 1 else "them"))
        return "; ".join(parts)

    def case_lines(self, key: Sequence[str], geomean: tuple, geomean_label: str | None) -> list[str]:
        """Up to :data:`TOP` of the pairs that tripped the rule (case, ratio, interval, label;
        AMBIGUOUS: the pairs that would decide it where known), how many more, and the geometric
        mean when it tripped it."""
        def needs(v):
            if _missing(v):
                return ""
            return "  no number of pairs" if not math.isfinite(v) else f"  about {int(v):,} pairs"

        amb = self.rule.label == "AMBIGUOUS"
        head = self.tripped.head(TOP)
        suffix = [needs(v) for v in head["pairs_to_decide"]] if amb and "pairs_to_decide" in head else None
        extra = [("geometric mean", *geomean, geomean_label)] if self.geomean_tripped else []
        if suffix is not None and extra:
            suffix.append(needs(self.geomean_needs[0]))
        lines = _case_lines(head, key, extra, suffix=suffix)
        if len(self.tripped) > TOP:
            lines.insert(TOP, f"  ... and {len(self.tripped) - TOP} more")
        return lines

    def as_dict(self, key: Sequence[str] = ()) -> dict:
        """JSON-ready (NaN, NA and ``inf`` as None): ``fail_on`` (the rule's text), ``label``,
        ``threshold`` (fraction), ``limit``, ``warn``, ``hit``, ``geomean_tripped``,
        ``geomean_pairs_to_decide``, ``geomean_pairs_to_narrow``, ``reason`` and ``tripped``
        (one dict per pair, as in :attr:`GateResult.as_dict`, with an AMBIGUOUS rule's
        ``width``, ``worker_pairs``, ``pair_sd``, ``pairs_to_decide``, ``pairs_to_narrow``)."""
        t = self.tripped
        return jsonable({"fail_on": self.rule.text, "label": self.rule.label, "threshold": self.rule.threshold,
                         "limit": self.rule.limit, "warn": self.rule.warn, "hit": self.hit,
                         "geomean_tripped": self.geomean_tripped,
                         "geomean_pairs_to_decide": self.geomean_needs[0],
                         "geomean_pairs_to_narrow": self.geomean_needs[1], "reason": self.reason,
                         "tripped": _pair_records(t[[c for c in t if c not in ("time_a_ms", "time_b_ms")]], key)})


@dataclass(frozen=True)
class GateResult:
    """The outcome of :func:`gate`. ``results``: one :class:`RuleResult` per rule, in the
    order given; ``geomean``: ``(geomean, lo, hi)`` of all pairs; ``geomean_label`` its label
    (None without an interval); ``names``, ``key``: as in the :class:`flyexplore.results.compare.ABResult`. The
    properties read them together: :attr:`failed` (a rule that fails tripped), :attr:`warned`
    (a ``:warn`` rule tripped), :attr:`tripped` and :attr:`geomean_tripped` (of the rules that
    fail)."""

    results: tuple[RuleResult, ...]
    geomean: tuple[float, float, float]
    geomean_label: str | None
    names: tuple[str, str] = ("A", "B")
    key: tuple[str, ...] = ()

    @property
    def rules(self) -> tuple[FailOn, ...]:
        """The rules, in order."""
        return tuple(r.rule for r in self.results)

    @property
    def text(self) -> str:
        """The rules as ``--fail-on`` takes them: ``"SLOWER:5%,AMBIGUOUS:5%"``."""
        return ",".join(r.text for r in self.rules)

    @property
    def failed(self) -> bool:
        """True when a rule without ``:warn`` tripped (``flyexplore compare`` exits 1)."""
        return any(r.hit and not r.rule.warn for r in self.results)

    @property
    def warned(self) -> bool:
        """True when a ``:warn`` rule tripped (the gate says WARNING unless it failed)."""
        return any(r.hit and r.rule.warn for r in self.results)

    @property
    def outcome(self) -> str:
        """``"FAILED"``, ``"WARNING"`` (only ``:warn`` rules tripped) or ``"passed"``."""
        return "FAILED" if self.failed else "WARNING" if self.warned else "passed"

    @property
    def tripped(self) -> pd.DataFrame:
        """The pairs that tripped a rule that fails (``:warn`` rules' are in :attr:`results`),
        each once, in rule order."""
        got = [r.tripped for r in self.results if not r.rule.warn and len(r.tripped)]
        if len(got) == 1:
            return got[0]
        if not got:
            fail = [r.tripped for r in self.results if not r.rule.warn]
            return (fail or [r.tripped for r in self.results])[0].iloc[0:0]
        both = pd.concat(got, ignore_index=True)
        keys = [k for k in self.key if k in both]
        return both.drop_duplicates(subset=keys or None).reset_index(drop=True)

    @property
    def geomean_tripped(self) -> bool:
        """Whether the geometric mean tripped a rule that fails."""
        return any(r.geomean_tripped and not r.rule.warn for r in self.results)

    @property
    def headline(self) -> str:
        """The outcome in one sentence (not wrapped): ``gate --fail-on SLOWER:5%: FAILED: 2 pairs
        are B slower by more than 5% (interval's upper end below 0.952x)`` or ``...: passed: ...``
        or ``...: WARNING: ...``."""
        return f"gate --fail-on {self.text}: {self.outcome}: {self.reason}"

    @property
    def reason(self) -> str:
        """:attr:`headline` after the outcome: what tripped each rule, or that nothing did (with
        several rules, each rule's text first)."""
        if len(self.results) == 1:
            return self.results[0].reason
        return "; ".join(f"{r.rule.text}: {r.reason}" for r in self.results)

    @property
    def lines(self) -> list[str]:
        """The gate's outcome as text lines of at most :data:`flyexplore.results.pairtext.WIDTH` characters:
        :attr:`headline` (wrapped), then, for each rule that tripped (with several rules, under
        its text), up to :data:`TOP` of the pairs that tripped it (SLOWER: most slowed first;
        AMBIGUOUS: widest first, with the pairs of workers that would decide each where known;
        case, ratio, interval, label), how many more, and the geometric mean when it tripped
        it."""
        out = _wrap(self.headline)
        for r in self.results:
            if not r.hit:
                continue
            if len(self.results) > 1:
                out.append(f" {r.rule.text} ({'warns' if r.rule.warn else 'fails'}):")
            out += r.case_lines(self.key, self.geomean, self.geomean_label)
        return out

    def as_dict(self) -> dict:
        """JSON-ready (NaN as None): ``fail_on`` (the whole text), ``failed``, ``warned``,
        ``outcome``, ``geomean_tripped``, ``tripped`` (one dict per pair that tripped a rule that
        fails: ``case_key`` (the key values as one text), the key columns, ``ratio``,
        ``ratio_lo``, ``ratio_hi``, ``verdict``), ``rules`` (:meth:`RuleResult.as_dict` each);
        with one rule also its ``label``, ``threshold`` (fraction) and ``limit`` (ratio), None
        with several."""
        t = self.tripped
        one = self.rules[0] if len(self.rules) == 1 else None
        tripped = _pair_records(t[[c for c in t if c not in ("time_a_ms", "time_b_ms")]], self.key)
        return jsonable({"fail_on": self.text, "label": one.label if one else None,
                         "threshold": one.threshold if one else None, "limit": one.limit if one else None,
                         "failed": self.failed, "warned": self.warned, "outcome": self.outcome,
                         "geomean_tripped": self.geomean_tripped, "tripped": tripped,
                         "rules": [r.as_dict(self.key) for r in self.results]})


def gate(ab: Any, fail_on: "str | FailOn | Sequence[str | FailOn]" = "SLOWER") -> GateResult:
    """Judge an A/B for CI by one or more rules (:class:`FailOn`; ``fail_on``: ``--fail-on``
    text such as ``"SLOWER:5%,AMBIGUOUS:5%"``, :func:`parse_rules`, or :class:`FailOn` s).
    ``ab``: an :class:`flyexplore.results.compare.ABResult` or the
    :class:`flyexplore.results.compare.Sides` of :func:`flyexplore.results.compare.sides`.

    SLOWER: the gate fails when any pair, or the geometric mean of all pairs
    (:attr:`flyexplore.results.compare.ABResult.geomean_ci`, labelled by
    :func:`flyexplore.measure.stats.verdict`), is labelled SLOWER (B slower) and its interval's
    upper end ``ratio_hi`` is below ``1 / (1 + threshold)``, so that B is slower by more than the
    threshold even at the interval's most favourable end. AMBIGUOUS: it fails when any pair, or
    the geometric mean, is labelled AMBIGUOUS and its interval's width ``hi / lo - 1`` is above
    the rule's width; the outcome says what would decide each: for a pair whose interval came
    from an environment A/B's pairs of workers (``between-pair``,
    :func:`flyexplore.results.compare.pair`'s ``pair_sd``), about how many pairs
    (:func:`flyexplore.measure.stats.pairs_to_decide`: to decide the label if the estimate held,
    and to bring the width within the rule's), else a quieter machine or more rounds. The
    geometric mean's spread is ``sqrt(sum sd_i**2) / n`` of its n pairs' (their half-widths
    added in quadrature, :func:`flyexplore.measure.stats.geomean_ci`), known when every pair's is
    and all came from as many pairs of workers. A rule with ``:warn`` only warns. Pairs without a
    label (published figures, no interval) never trip a rule; a pair of a result set with itself
    never does (its ratios are 1, SAME). Returns a :class:`GateResult`. Raises
    :class:`UsageError` for a bad ``fail_on`` or for a vllm A/B (its speedups carry no interval
    to gate on)."""
    rules = parse_rules(fail_on)
    if hasattr(ab, "kind"):   # a Sides (flyexplore.results.compare.sides): its kind, then its A/B
        if ab.kind != "rows":
            raise UsageError("--fail-on gates flyexplore result rows; vllm bench results carry no "
                             "per-case interval to gate on")
        ab = ab.ab
    gm = ab.geomean_ci
    gl = _geomean_label(gm)
    sd_g = _geomean_spread(ab.pairs)
    results = tuple(_check(ab, r, gm, gl, sd_g) for r in rules)
    return GateResult(results, gm, gl, tuple(ab.names), tuple(ab.key))


def _width(lo, hi) -> np.ndarray:
    """``hi / lo - 1`` (the AMBIGUOUS rule's width; NaN where a bound is missing or not positive)."""
    lo, hi = np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((lo > 0) & np.isfinite(lo) & np.isfinite(hi), hi / lo - 1.0, np.nan)


def _geomean_spread(p: pd.DataFrame) -> float:
    """The per-pair spread of the geometric mean of ``p``'s ratios, in log space:
    ``sqrt(sum pair_sd**2) / n`` when every pair has one from as many pairs of workers, else NaN."""
    if "pair_sd" not in p or "worker_pairs" not in p or not len(p):
        return math.nan
    sd = pd.to_numeric(p["pair_sd"], errors="coerce").to_numpy(dtype=float)
    k = pd.to_numeric(p["worker_pairs"], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    if not (np.isfinite(sd).all() and np.isfinite(k).all()) or len(set(k.tolist())) != 1:
        return math.nan
    return float(math.sqrt(float(np.sum(sd ** 2))) / len(sd))


def _needs(sd: float, est: float, width: float) -> tuple:
    """``(pairs_to_decide, pairs_to_narrow)`` of one AMBIGUOUS reading (None where the spread is
    unknown; narrow None for a rule of width 0)."""
    if not math.isfinite(sd):
        return (None, None)
    return (S.pairs_to_decide(sd, S.BAND, estimate=est), S.pairs_to_decide(sd, width) if width > 0 else None)


def _check(ab: Any, rule: FailOn, gm: tuple, gl: str | None, sd_g: float) -> RuleResult:
    """One rule of :func:`gate` on ``ab``'s pairs and geometric mean."""
    p = ab.pairs
    lo = pd.to_numeric(p["ratio_lo"], errors="coerce").to_numpy(dtype=float)
    hi = pd.to_numeric(p["ratio_hi"], errors="coerce").to_numpy(dtype=float)
    is_label = (p["verdict"] == rule.label).fillna(False).to_numpy(dtype=bool)
    cols = [*ab.key, "time_a_ms", "time_b_ms", "ratio", "ratio_lo", "ratio_hi", "verdict"]
    if rule.label == "SLOWER":
        with np.errstate(invalid="ignore"):
            bad = is_label & (hi < rule.limit)
        tripped = p.loc[bad, [c for c in cols if c in p]]
        order = np.argsort(pd.to_numeric(tripped["ratio"], errors="coerce").to_numpy(dtype=float), kind="stable")
        g_bad = bool(gl == rule.label and math.isfinite(gm[2]) and gm[2] < rule.limit)
        return RuleResult(rule, tripped.iloc[order].reset_index(drop=True), g_bad, (None, None), tuple(ab.names))
    width = _width(lo, hi)
    with np.errstate(invalid="ignore"):
        bad = is_label & ~(width <= rule.threshold)
    tripped = p.loc[bad, [c for c in (*cols, "worker_pairs", "pair_sd") if c in p]].copy()
    tripped.insert(tripped.columns.get_loc("verdict") + 1, "width", width[bad])
    sds = pd.to_numeric(tripped.get("pair_sd", pd.Series(np.nan, index=tripped.index)), errors="coerce")
    needs = [_needs(float(s), float(e), rule.threshold) for s, e in
             zip(sds.to_numpy(dtype=float), pd.to_numeric(tripped["ratio"], errors="coerce").to_numpy(dtype=float))]
    tripped["pairs_to_decide"] = pd.Series([n[0] for n in needs], index=tripped.index, dtype=object)
    tripped["pairs_to_narrow"] = pd.Series([n[1] for n in needs], index=tripped.index, dtype=object)
    order = np.argsort(-np.nan_to_num(tripped["width"].to_numpy(dtype=float), nan=np.inf), kind="stable")
    gw = float(_width(gm[1], gm[2]))
    g_bad = bool(gl == "AMBIGUOUS" and not gw <= rule.threshold)
    g_needs = _needs(sd_g, gm[0], rule.threshold) if g_bad else (None, None)
    return RuleResult(rule, tripped.iloc[order].reset_index(drop=True), g_bad, g_needs, tuple(ab.names))
