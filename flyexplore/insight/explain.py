"""Will a call take FlyDSL, and if not, why not? The eligibility explainer's front door.

:func:`explain` takes an operator and concrete arguments (tensors) or a description of them
(:class:`~flyexplore.world.conditions.TensorDesc`: shape, dtype, strides, storage offset, device) and
returns an :class:`~flyexplore.world.conditions.Explanation`: every condition torch 2.15 applies, each
evaluated and phrased in words with the torch module and function it comes from, and the verdict.

Nothing here knows an operator family: each family registers its route, rules, options and
example on its :class:`~flyexplore.ops.base.Operator` (``op.flydsl``, a
:class:`~flyexplore.ops.base.FlyDSLPath`, in ``flyexplore/ops/<family>_flydsl.py``), and this
module dispatches through the registry. The environment's conditions (ROCm build, flydsl version
and runtime, arch, switches, ``TORCH_DISABLE_NATIVE_JIT``) come from :mod:`flyexplore.world.readiness`,
the one readiness model ``flyexplore env``, the sweep and the X-ray use too; ``assume_rocm=True``
judges as on a ROCm torch 2.15 with flydsl 0.3.x on the given arch, for what-if questions on other
machines. Every rule is checked against torch's own functions (``tests/ops/test_explain_agreement.py``).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

from flyexplore.errors import UsageError, bad_choice
from flyexplore.ops import flydsl_ops, get_op
from flyexplore.parsing import parse_flag, parse_options
from flyexplore.world.conditions import (
    Condition,
    Explanation,
    TensorDesc,
    autotune_mode,
    contiguous_strides,
    short_dtype,
)
from flyexplore.world.facts import facts
from flyexplore.world.readiness import (
    ARCHES,
    FLYDSL_ARCH,
    MI355X_CUS,
    EnvFacts,
    check_arch,
    compile_environment,
    eager_environment,
    torch_eager_arch,
)
from flyexplore.world.switches import compile_options as flydsl_options

__all__ = ["ARCHES", "FLYDSL_ARCH", "MI355X_CUS", "Condition", "EnvFacts", "Explanation", "TensorDesc",
           "contiguous_strides", "describe", "dtypes_for", "eligibility_grid", "examples", "explain",
           "explain_case", "explain_shape", "explain_text", "explainable", "facts", "options_for",
           "parse_options", "torch_eager_arch"]

#: Notes every Inductor-template (compile route) explanation carries.
COMPILE_NOTES = (
    "eligible means FlyDSL is a candidate: max-autotune benchmarks it against the other "
    "backends and the fastest wins; see flyexplore.insight.trace for the autotune decision",
    "Inductor's pad_mm pass (config.shape_padding) may pad unaligned dimensions before "
    "lowering; the rules above judge the call as given",
)


def explainable(with_own_front_door: bool = False) -> dict[str, str]:
    """Operators the explainer answers for, with the torch path each takes (``{name: path}``):
    those whose family registers rules (``op.flydsl.judge``); with ``with_own_front_door`` also
    those with their own :func:`explain_text` (attention)."""

    out = {}
    for n in flydsl_ops():
        p = get_op(n).flydsl
        if p.judge is not None or (with_own_front_door and p.explain_text is not None):
            out[n] = p.path
    return out


def _path(op: str, with_own_front_door: bool = False):
    names = explainable(with_own_front_door)
    if op not in names:
        raise bad_choice("operator for explain", op, names)
    return get_op(op).flydsl


def options_for(op: str) -> tuple[str, ...]:
    """The ``key=value`` options of ``flyexplore explain --op <op> --opt`` (the family's
    ``FlyDSLPath.options``). Raises :class:`UsageError` for an operator without rules."""
    return tuple(_path(op, True).options)


def examples() -> dict[str, str]:
    """An example shape per explainable operator, in the operator catalogue's syntax."""
    return {n: get_op(n).flydsl.example for n in explainable(True)}


def explain(op: str, *, env: EnvFacts | None = None, **call) -> Explanation:
    """Explain whether ``op`` with the given arguments takes FlyDSL.

    ``op``: one of :func:`explainable`. Keyword arguments (tensors or :class:`TensorDesc`): the
    family's ``judge`` (``flyexplore/ops/<family>_flydsl.py``), e.g.

    - rmsnorm: ``x, normalized_shape, weight=None, eps=1e-6``
    - topk: ``x, k, dim=-1, largest=True, sorted=True, deterministic=False``
    - gemm: ``a, b, out_dtype=None, bias=False``
    - grouped_gemm: ``a, b, offs=True, bias=False, scaled=False, out_dtype=None``
    - scaled_gemm: ``a, b, scale_a, scale_b, recipe_a/b, swizzle_a/b, out_dtype, bias, use_fast_accum,
      contraction_dim, scale_levels``

    and for the compile route (Inductor templates) ``dynamic=False, autotuning=None,
    search_space=None`` (``None``: the process's Inductor settings).
    ``env``: the :class:`EnvFacts` to judge against (default: :func:`facts` of this process).
    Raises :class:`UsageError` for an unknown operator or argument.
    """
    path = _path(op)
    f = env or facts()
    common: dict[str, Any] = {}
    if path.route == "compile":
        at, ss = autotune_mode(f, call.pop("autotuning", None), call.pop("search_space", None))
        common = dict(dynamic=call.pop("dynamic", False), autotuning=at, search_space=ss,
                      assume_aligned_inputs=bool(f.inductor.get("assume_aligned_inputs")))
    try:
        got = path.judge(call, f, common)
    except KeyError as exc:
        raise UsageError(f"explain {op} needs argument {exc.args[0]!r}") from None
    if not (isinstance(got, tuple) and len(got) == 4):
        raise TypeError(f"{op}'s FlyDSLPath.judge returned {type(got).__name__} of {len(got) if hasattr(got, '__len__') else '?'}"
                        " items; it must return (arguments, conditions, kernel, notes)")
    args, rules, kernel, notes = got
    if call:
        raise UsageError(f"unknown argument(s) for explain {op}: {', '.join(sorted(call))}")
    conds = (eager_environment(f, op) if path.route == "eager" else compile_environment(f)) + list(rules)
    notes = list(notes) + (list(COMPILE_NOTES) if path.route == "compile" else [])
    if f.assumed is None and f.environ.get("FLYDSL_GPU_ARCH") and path.route == "eager":
        notes.append("torch caches the arch per process at the first FlyDSL call: set FLYDSL_GPU_ARCH before it")
    args = {k: (short_dtype(v) if hasattr(v, "is_floating_point") else v) for k, v in args.items()}
    call_ok = all(c.ok for c in conds if c.kind in ("call", "config"))
    return Explanation(op, path.path, args, tuple(conds), kernel if call_ok else None, tuple(notes), f.assumed)


# -- from the operator catalogue / command line ------------------------------------------------

def _catalogue(op: str):
    return get_op(op)


def _case_and_options(op: str, shape: str, opts: Mapping[str, Any] | None):
    """The catalogue's case for ``shape`` and the explainer options, those written inline after
    ``:`` (``MxNxK:bias=1``) moved into a copy of ``opts``."""
    path, cat = _path(op), _catalogue(op)
    opts = dict(opts or {})
    head, _, tail = str(shape).strip().partition(":")
    kept = []
    for tok in filter(None, (t.strip() for t in tail.split(","))):
        k, eq, v = tok.partition("=")
        if eq and k.strip() in path.options and k.strip() not in cat.options:
            opts.setdefault(k.strip(), v.strip())
        else:
            kept.append(tok)
    return cat.case(head + (":" + ",".join(kept) if kept else "")), opts


def describe(op: str, shape: str, dtype: str | None = None, opts: Mapping[str, Any] | None = None) -> dict:
    """Keyword arguments for :func:`explain` from a shape text in the operator catalogue's
    syntax (parsed by the catalogue: ``MxNxK:NT``, ``MxN:eps=1e-5``, ``GxMxNxK:layout=NT``,
    ``MxNxK:scaling=row``; explainer options may be written there too, ``MxNxK:bias=1``), a dtype
    name (default: the catalogue's first) and the family's options (:func:`options_for`).
    Raises :class:`UsageError` for bad input, naming the value."""
    path = _path(op)
    case, opts = _case_and_options(op, shape, opts)
    cat = _catalogue(op)
    for k in opts:
        if k not in path.options:
            raise bad_choice(f"explain option for {op}", k, path.options)
    dt = cat.check_dtype(dtype or cat.dtypes[0])
    dev = str(opts.pop("device", "cuda:0"))
    common: dict[str, Any] = {}
    if path.route == "compile":
        if "dynamic" in opts:
            common["dynamic"] = parse_flag(opts.pop("dynamic"))
        if "autotuning" in opts:
            common["autotuning"] = parse_flag(opts.pop("autotuning"))
        if "search_space" in opts:
            ss = str(opts.pop("search_space")).upper()
            if ss not in ("DEFAULT", "EXHAUSTIVE"):
                raise bad_choice("search_space", ss, ("DEFAULT", "EXHAUSTIVE"))
            common["search_space"] = ss
    return {**path.describe(case, dt, opts, dev), **common}


def explain_shape(op: str, shape: str, dtype: str | None = None, opts: Mapping[str, Any] | None = None, *,
                  arch: str | None = None, cu: int | None = None, assume_rocm: bool = False,
                  compile_options: Mapping[str, Any] | None = None) -> Explanation:
    """:func:`explain` from a shape text, dtype name and options (what ``flyexplore explain``
    runs). ``arch`` / ``cu`` / ``assume_rocm`` / ``compile_options`` go to :func:`facts`. The
    family's notes on the catalogue case (``FlyDSLPath.case_notes``: a ragged grouped GEMM's group
    sizes) follow the explanation's own, as in the sweep's rows (:func:`explain_case`). Raises
    :class:`UsageError` for an ``arch`` that is not a gfx name (``""`` included: it is not taken
    as gfx950)."""
    check_arch(arch)
    path = _path(op)
    call = describe(op, shape, dtype, opts)
    cu = call.pop("_cu", cu)
    f = facts(arch=arch, cu=cu, assume_rocm=assume_rocm,
              compile_options=compile_options if path.route == "compile" else None)
    ex = explain(op, env=f, **call)
    notes = tuple(path.case_notes(_case_and_options(op, shape, opts)[0])) if path.case_notes else ()
    return replace(ex, notes=ex.notes + notes) if notes else ex


def explain_case(op_name: str, case, dtype: str, env: EnvFacts | None = None,
                 compile_options: Mapping[str, Any] | None = None) -> Explanation | None:
    """The explanation for one catalogue case (:class:`~flyexplore.ops.base.Case`) run with
    FlyDSL, or ``None`` for an operator the explainer does not cover. ``compile_options``
    are the options the flydsl backend compiles with."""
    if op_name not in explainable():
        return None
    path = _path(op_name)
    call = path.describe(case, dtype, {}, "cuda:0")
    call.pop("_cu", None)
    f = env or facts(compile_options=compile_options if path.route == "compile" else None)
    ex = explain(op_name, env=f, **call)
    return replace(ex, notes=ex.notes + tuple(path.case_notes(case))) if path.case_notes else ex


# -- the dispatch inspector's front door and the eligibility grid ---------------------------------

def dtypes_for(op: str) -> tuple[str, ...]:
    """The dtype names an explainable operator takes (its catalogue's, first = default).
    Raises :class:`UsageError` for an operator the explainer does not cover."""
    _path(op, True)
    return tuple(get_op(op).dtypes)


def explain_text(op: str, shape: str, dtype: str | None = None,
                 options: str | Mapping[str, Any] | None = None, *, arch: str | None = FLYDSL_ARCH,
                 cu: int | None = None, compile_options: Mapping[str, Any] | None = None, **kw) -> Explanation:
    """The dispatch inspector's question, from text: would ``op`` on ``shape`` (the operator
    catalogue's syntax -- ``8192x4096``, ``4096x2048x8``, ``16x28672x4096:NT``,
    ``8x512x4096x4096[:layout=NT]``, ``32x4096x4096[:scaling=row]``) in ``dtype`` take FlyDSL,
    and why (not)?

    ``options``: more of the call as ``"key=value; key=value"`` text or a mapping
    (:func:`options_for`). ``arch``: a gcnArchName (default gfx950): judged as on a ROCm
    torch 2.15 with flydsl 0.3.x on that arch (:func:`facts` with ``assume_rocm``), with this
    process's switches; ``None``: this process's real environment. ``cu``: CU count for TopK's
    row gate (default 256, an MI355X). ``compile_options`` (GEMMs): the ``torch.compile``
    options to judge under; default FLYDSL added to this process's
    ``max_autotune_gemm_backends`` with max-autotune, i.e. what the catalogue's ``flydsl``
    backend compiles with (as ``flyexplore explain`` does). A family with its own front door
    (attention) gets ``shape``, ``dtype``, the options, ``arch`` and ``kw`` (e.g. ``aotriton``).
    Raises :class:`UsageError` for bad input (the message names the bad value and the valid
    choices)."""
    path = _path(op, True)
    if not str(shape or "").strip():
        raise UsageError(f"no {op} shape given (e.g. {path.example})")
    check_arch(arch)
    opts = parse_options(options)
    if path.judge is None:
        return path.explain_text(str(shape), dtype, opts, arch=arch, **kw)
    if kw:
        raise UsageError(f"unknown argument(s) for explain {op}: {', '.join(sorted(kw))}")
    comp = compile_options_for(op, compile_options)
    return explain_shape(op, str(shape), dtype, opts, arch=arch, cu=cu, assume_rocm=arch is not None,
                         compile_options=comp)


def compile_options_for(op: str, compile_options: Mapping[str, Any] | None):
    """Inductor options to judge a compiled op with: the given ones, else this process's GEMM
    backends with FLYDSL added (``switches.compile_options``); None for eager ops."""
    if _path(op).route != "compile":
        return None
    if compile_options is not None:
        return dict(compile_options)
    from torch._inductor import config as ic

    return flydsl_options(True, backends=ic.max_autotune_gemm_backends)


def eligibility_grid(op: str, ms: Sequence[int] | int | None = None, ns: Sequence[int] | int | None = None,
                     dtype: str | None = None, *, dims: Mapping[str, Sequence[int] | int] | None = None,
                     options: str | Mapping[str, Any] | None = None, arch: str | None = FLYDSL_ARCH,
                     cu: int | None = None, compile_options: Mapping[str, Any] | None = None):
    """Where in the shape space FlyDSL is taken: :func:`explain` at every combination of the
    given dimension values, as a tidy ``pandas.DataFrame`` for
    :func:`flyexplore.views.plots.heatmap_figure` (``kind="eligibility"``).

    ``ms`` / ``ns``: M and N values (a list sweeps a dimension, an int fixes it); ``dims``: the
    operator's other dimensions the same way (topk ``k``, gemm/scaled_gemm ``k``, grouped_gemm
    ``g`` and ``k``; or ``m`` / ``n`` instead of ``ms`` / ``ns``). Every dimension of the
    operator (:func:`flyexplore.ops.get_op` ``.dims``) must be given. ``dtype``, ``options``,
    ``arch``, ``cu`` and ``compile_options`` as in :func:`explain_text` (default: judged for
    gfx950 with this process's switches; GEMMs with FLYDSL on).

    Columns: the operator's dimensions (ints), ``dtype``, ``value`` (bool: FlyDSL taken),
    ``call_ok`` (the call qualifies, whatever the environment), ``kernel`` (the FlyDSL kernel
    family, e.g. TopK ``register`` or ``radix K 64-256, N 8192-32768``; ``None`` when the call
    does not qualify) and ``reason`` (one line: the failed conditions, or the kernel). One row
    per combination, the operator's first dimension varying slowest. Raises :class:`UsageError` for an
    unknown operator, a missing or unknown dimension or a non-positive value."""
    import itertools

    import pandas as pd


    _path(op)
    order = get_op(op).dims
    given: dict[str, Any] = {}
    if ms is not None:
        given["m"] = ms
    if ns is not None:
        given["n"] = ns
    for k, v in (dims or {}).items():
        if k in given:
            raise UsageError(f"dimension {k!r} given twice")
        given[k] = v
    for k in given:
        if k not in order:
            raise bad_choice(f"dimension of {op}", k, order)
    missing = [d for d in order if d not in given]
    if missing:
        raise UsageError(f"eligibility_grid {op} needs values for {', '.join(missing)} "
                         f"(dimensions {'x'.join(order)})")
    axes = []
    for d in order:
        v = given[d]
        vals = [int(v)] if isinstance(v, (int, float)) else [int(x) for x in v]
        if not vals or min(vals) <= 0:
            raise UsageError(f"{op} {d} values must be positive integers, got {v!r}")
        axes.append(vals)
    opts = parse_options(options)
    check_arch(arch)
    comp = compile_options_for(op, compile_options)
    f = facts(arch=arch, cu=cu, assume_rocm=arch is not None, compile_options=comp)
    dt = dtype or dtypes_for(op)[0]
    rows = []
    for combo in itertools.product(*axes):
        shape = "x".join(map(str, combo))
        call = describe(op, shape, dt, dict(opts))
        call.pop("_cu", None)
        ex = explain(op, env=f, **call)
        rows.append({**dict(zip(order, combo)), "dtype": dt, "value": ex.taken, "call_ok": ex.call_ok,
                     "kernel": ex.kernel, "reason": ex.reason})
    return pd.DataFrame(rows, columns=[*order, "dtype", "value", "call_ok", "kernel", "reason"])
