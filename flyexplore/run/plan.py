"""The plan of a sweep: :class:`Plan` -- an operator, its ``(case, dtype)`` pairs and its backend
names, each once -- made from a suite or shape text (:func:`make_plan`) or from a shapes file that
a model's capture exported (:func:`read_shapes_file`, :func:`shapes_file_plan`). Names are checked
against the catalogue (no torch); a bad one is a one-line :class:`~flyexplore.errors.UsageError`.
:class:`flyexplore.run.spec.SweepSpec` resolves its plan here.
How a worker process finds an operator (:func:`resolve_op`, :func:`op_ref`) is here too: the
plan's operator is named by it.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from flyexplore.errors import UsageError
from flyexplore.ops import builtin_ops, get_op
from flyexplore.ops.base import Case, Operator

# -- the plan -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """What a sweep will run: an operator, ``(case, dtype)`` pairs and backend names, each pair
    and backend once (:func:`make_plan` and :func:`shapes_file_plan` fold repeats, so a sweep
    never writes a row twice)."""

    op: Operator
    pairs: tuple[tuple[Case, str], ...]
    backends: tuple[str, ...]
    #: per ``(case label, dtype)``: columns every row of that case gets (a model's calls:
    #: ``model``, ``model_module``, ``model_count``, ``model_uses``; :func:`shapes_file_plan`)
    meta: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    #: what was changed on the way from the request to the plan, one line each, for the user
    #: (``2 duplicate entries folded (first kept): 64x64x64 fp32 (x3)``)
    notes: tuple[str, ...] = ()

    def items(self) -> list[tuple[Case, str, str]]:
        return [(c, d, b) for c, d in self.pairs for b in self.backends]

    def __len__(self) -> int:
        return len(self.pairs) * len(self.backends)


def _split(v: str | Iterable[str] | None) -> list[str] | None:
    if v is None:
        return None
    if isinstance(v, str):
        return [x.strip() for x in v.split(",") if x.strip()]
    return list(v)


def make_plan(op: str | Operator, suite: str | None = None, shapes: str | Sequence | None = None,
              dtypes: str | Sequence[str] | None = None,
              backends: str | Sequence[str] | None = None) -> Plan:
    """Resolve and validate a sweep plan. ``op``: a catalogue name, an :class:`Operator`, or
    an import path ``"module:attribute"`` of one (:func:`resolve_op`).
    Exactly one of ``suite`` and ``shapes`` (a text such
    as ``"4096x4096x4096;8x4096x4096"`` or a list of texts / :class:`Case`).
    ``dtypes`` defaults to the suite's (or the operator's first); ``backends`` to all.

    Repeats are folded, the first kept: ``(case, dtype)`` pairs with the same case label and
    dtype (``"64x64x64;64x64x64"``, ``--dtypes fp32,fp32``, or two spellings of one case,
    ``64x64x64`` and ``64x64x64:NT``) and repeated backends; :attr:`Plan.notes` says what was
    folded. Every pair's tensors are checked against int64 (:meth:`Operator.tensor_sizes`).

    Raises :class:`UsageError` naming any unknown operator, suite, dtype, backend or bad shape,
    a dimension or tensor whose element count does not fit int64, or what an operator lacks to
    be measured (``make_inputs``, ``reference``, ``error``, a backend). Imports no torch.
    """

    op = _measurable(op)
    if (suite is None) == (shapes is None):
        raise UsageError("give exactly one of a suite and shapes")
    dts = _split(dtypes)
    for d in dts or ():
        op.check_dtype(d)
    if suite is not None:
        pairs = op.get_suite(suite).pairs(dts)
    else:
        if isinstance(shapes, str):
            cases = op.parse_shapes(shapes)
        else:
            cases = tuple(s if isinstance(s, Case) else op.case(s) for s in shapes)
            if not cases:
                raise UsageError(f"no {op.name} shapes given")
        pairs = tuple((c, d) for c in cases for d in (dts or [op.dtypes[0]]))
    pairs, notes = _fold_pairs(pairs)
    _check_sizes(op, pairs)
    bks, bnote = _backends(op, backends)
    return Plan(op, pairs, bks, notes=notes + bnote)


#: How many folded entries a note names before it says "and N more".
NOTE_NAMES = 5


def _fold_note(what: str, counts: Mapping[str, int]) -> tuple[str, ...]:
    """One note for the repeated ``counts`` (name -> times given), or none: how many entries
    were dropped, and the first :data:`NOTE_NAMES` names with the times each was given.
    ``what``: the words before ``entries`` (``"duplicate"``, ``"duplicate backend"``)."""
    rep = {k: n for k, n in counts.items() if n > 1}
    if not rep:
        return ()
    dropped = sum(n - 1 for n in rep.values())
    names = [f"{k} (x{n})" for k, n in rep.items()]
    more = f", and {len(names) - NOTE_NAMES} more" if len(names) > NOTE_NAMES else ""
    return (f"{dropped} {what} {'entry' if dropped == 1 else 'entries'} folded (first kept): "
            + ", ".join(names[:NOTE_NAMES]) + more,)


def _counts(names: Iterable[str]) -> dict[str, int]:
    """Times each name occurs, in first-seen order."""
    out: dict[str, int] = {}
    for n in names:
        out[n] = out.get(n, 0) + 1
    return out


def _fold_pairs(pairs: Iterable[tuple[Case, str]]) -> tuple[tuple[tuple[Case, str], ...], tuple[str, ...]]:
    """``pairs`` with the first of each ``(case label, dtype)`` kept, and the note saying what
    was folded (:func:`_fold_note`)."""
    pairs = tuple(pairs)
    kept: dict[tuple[str, str], tuple[Case, str]] = {}
    for c, d in pairs:
        kept.setdefault((c.label, d), (c, d))
    return tuple(kept.values()), _fold_note("duplicate", _counts(f"{c.label} {d}" for c, d in pairs))


def _check_sizes(op: Operator, pairs: Iterable[tuple[Case, str]]) -> None:
    """Every pair's tensors within int64 (:meth:`Operator.tensor_sizes` raises the
    :class:`UsageError` naming the shape): before anything allocates."""
    for c, d in pairs:
        op.tensor_sizes(c, d)


def _measurable(op: str | Operator) -> Operator:
    """The Operator of ``op`` (:func:`resolve_op` for a name), refused with a :class:`UsageError`
    when it is none or lacks what measuring needs."""
    op = resolve_op(op) if isinstance(op, str) else op
    if not isinstance(op, Operator):
        raise UsageError(f"op must be an operator name, 'module:attribute' or an Operator, "
                         f"got {type(op).__name__}")
    missing = [k for k in ("make_inputs", "reference", "error") if not callable(getattr(op, k, None))]
    if missing or not op.backends:
        raise UsageError(f"operator {op.name!r} cannot be measured: it has no "
                         + ", ".join(missing + ([] if op.backends else ["backend"]))
                         + " (docs/adding-an-operator.md)")
    return op


def _backends(op: Operator, backends: str | Sequence[str] | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The plan's backend names, each checked and each once (default: all of the operator's),
    and the note naming the repeated ones that were folded (:func:`_fold_note`)."""
    bks = _split(backends) or list(op.backends)
    for b in bks:
        op.get_backend(b)
    if not bks:
        raise UsageError("no backends given")
    counts = _counts(bks)
    return tuple(counts), _fold_note("duplicate backend", counts)


#: Columns an exported shapes file must have (``flyexplore model --export-shapes``;
#: :func:`flyexplore.results.model.export_shapes` writes them, with ``model``, ``phase``, ``module``).
SHAPES_FILE_COLUMNS = ("op", "shape", "dtype", "count")


def read_shapes_file(path: str | os.PathLike, op: str) -> list[dict]:
    """The rows of ``op`` in an exported shapes file (CSV with :data:`SHAPES_FILE_COLUMNS`, plus
    ``model``, ``phase``, ``module`` when written by ``flyexplore model --export-shapes``).
    Raises :class:`UsageError` naming a missing, unreadable or empty file, a missing column, a
    header without rows, a bad count, or a file without ``op`` rows (listing the operators it
    has). Reads with the ``csv`` module: no pandas, no torch."""
    import csv

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"shapes file {str(p)!r} does not exist")
    try:
        with open(p, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            header = reader.fieldnames or []
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise UsageError(f"shapes file {str(p)!r} cannot be read ({type(exc).__name__})") from None
    if not header:
        raise UsageError(f"shapes file {str(p)!r} is empty: no header row (columns {', '.join(SHAPES_FILE_COLUMNS)} "
                         "expected, as flyexplore model --export-shapes writes them)")
    miss = [c for c in SHAPES_FILE_COLUMNS if c not in header]
    if miss:
        raise UsageError(f"shapes file {str(p)!r} lacks column(s) {', '.join(miss)}: not written by "
                         "flyexplore model --export-shapes")
    if not rows:
        raise UsageError(f"shapes file {str(p)!r} has its columns ({', '.join(header)}) but no rows: no shape "
                         "to measure")
    out = []
    for i, r in enumerate(rows, 2):
        if r.get("op") != op:
            continue
        try:
            n = int(r["count"])
        except (TypeError, ValueError):
            raise UsageError(f"shapes file {str(p)!r} line {i}: count {r.get('count')!r} is not an integer") from None
        if n < 1:
            raise UsageError(f"shapes file {str(p)!r} line {i}: count {n} must be at least 1")
        out.append({**r, "count": n})
    if not out:
        ops = sorted({r.get("op") or "" for r in rows})
        raise UsageError(f"shapes file {str(p)!r} has no {op} rows (it has: {', '.join(ops) or 'none'})")
    return out


def shapes_file_plan(op: str | Operator, path: str | os.PathLike, dtypes: Sequence[str] | None,
                     backends: Sequence[str] | None) -> Plan:
    """The plan of a sweep of a model's exported calls (``--shapes-from``): one ``(case, dtype)``
    per distinct shape and dtype of ``op`` in the file (``dtypes``, when given, replace the file's:
    e.g. fp32 on a CPU), and per pair
    the columns its rows keep: ``model``, ``model_module`` (``;``-joined module paths),
    ``model_count`` (calls per model step, all steps) and ``model_uses`` (JSON ``[{"phase", "step",
    "module", "count", "status"[, "variant", "replaces"]}]``, what :func:`flyexplore.results.model.weighted_estimate` weights by).
    Rows of one shape and dtype are one pair (their uses listed together); a dtype or backend
    given twice is folded, the first kept, with a note (:attr:`Plan.notes`), so no use is
    counted twice. Raises :class:`UsageError` for a bad file, shape or dtype, or a tensor whose
    element count does not fit int64 (:meth:`Operator.tensor_sizes`)."""
    op = _measurable(op)
    bks, notes = _backends(op, backends)
    rows = read_shapes_file(path, op.name)
    given = None
    if dtypes:
        counts = _counts(op.check_dtype(d) for d in _split(dtypes))
        given = list(counts)
        notes = _fold_note("duplicate dtype", counts) + notes
    acc: dict[tuple[str, str], dict] = {}
    cases: dict[str, Case] = {}
    for r in rows:
        c = cases.get(r["shape"])
        if c is None:
            c = cases[r["shape"]] = op.case(r["shape"])
        for dt in given or [op.check_dtype(str(r["dtype"]))]:
            e = acc.setdefault((c.label, dt), {"case": c, "model": r.get("model") or "", "uses": []})
            use = {"phase": r.get("phase") or "", "step": r.get("step") or r.get("phase") or "",
                   "module": r.get("module") or "", "count": r["count"], "status": r.get("status") or ""}
            if r.get("variant"):
                use.update(variant=r["variant"], replaces=r.get("replaces") or "")
            e["uses"].append(use)
    pairs = tuple((e["case"], dt) for (_, dt), e in acc.items())
    _check_sizes(op, pairs)
    meta = {k: {"model": e["model"], "model_module": ";".join(dict.fromkeys(u["module"] for u in e["uses"])),
                "model_count": sum(u["count"] for u in e["uses"]), "model_uses": json.dumps(e["uses"])}
            for k, e in acc.items()}
    return Plan(op, pairs, bks, meta, notes)


# -- how a worker finds an operator ----------------------------------------------------------------

def resolve_op(ref: str) -> Operator:
    """The :class:`~flyexplore.ops.base.Operator` for ``ref``: a catalogue name (``gemm``) or
    an import path ``"module:attribute"`` (how a worker process finds an operator that is not in
    the catalogue, e.g. a test's). Raises :class:`UsageError` naming ``ref`` when it cannot be
    imported or is not an Operator."""

    if ":" not in ref:
        return get_op(ref)
    mod, _, attr = ref.partition(":")
    try:
        obj = getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"cannot import operator {ref!r} ({type(exc).__name__}: {exc})") from None
    if not isinstance(obj, Operator):
        raise UsageError(f"{ref!r} is a {type(obj).__name__}, not a flyexplore Operator")
    return obj


def op_ref(op: Operator) -> str:
    """How a worker finds ``op``: its catalogue name, or the ``"module:attribute"`` it was
    loaded from (:func:`resolve_op` records it). Raises :class:`UsageError` for an Operator
    object a worker cannot import (pass ``"module:attribute"``, or use ``engine="in-process"``)."""

    if op.name in builtin_ops() and get_op(op.name) is op:
        return op.name
    # anything else (a family added by register_op, a test's operator) by its import path:
    # a worker imports the module, which registers the family again there
    for mod in list(sys.modules.values()):
        name = getattr(mod, "__name__", None)
        if not name or name == "__main__" or name.startswith(("torch", "flyexplore.")):
            continue
        for attr, val in list(vars(mod).items()):
            if val is op:
                return f"{name}:{attr}"
    raise UsageError(f"operator {op.name!r} is not importable by a worker process: define it at "
                     "module level and pass op='module:attribute', or use --in-process")
