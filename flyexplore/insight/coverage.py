"""Will the model take FlyDSL? A verdict for every distinct captured call, and what-if advice.

:func:`judge_capture` gives each distinct call of a :class:`~flyexplore.insight.capture.Capture`
the explainer's verdict (:func:`flyexplore.insight.explain.explain`, judged as on a ROCm torch
2.15 with flydsl 0.3.x on the target arch, as ``flyexplore explain --assume-rocm`` does) in the
capture's view:

- eager view: RMSNorm (``aten._fused_rms_norm``) and TopK (``aten.topk``) by their eager
  override rules; SDPA by AOTriton's rules (at best ``unverified`` away from the GPU); a GEMM is
  not FlyDSL in eager (the FlyDSL GEMMs are Inductor templates); a decomposed RMSNorm module
  never reaches the override.
- compiled view: ``aten.mm`` and ``aten._grouped_mm`` by the Inductor template rules with FLYDSL
  in ``max_autotune_gemm_backends`` and max-autotune (eligible means FlyDSL is a candidate:
  autotuning may still pick another kernel); ``aten.addmm`` is a GEMM with a bias; ``aten.bmm``
  has no FlyDSL path; TopK stays an ATen fallback (``config.triton.decompose_sort_ops`` off), so
  the eager override judges it; ``aten._fused_rms_norm`` is decomposed by Inductor (no FlyDSL).

:func:`what_if` re-judges changed calls where a small change to the model code would matter
(expert weights stored [G, K, N], ``F.rms_norm`` instead of a decomposed RMSNorm, a GEMM without
its bias, fp32 TopK scores, a bf16 model, ``torch.compile``) and says what the re-judged calls
come to, eligible or not. Nothing is advised that was not re-judged.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from flyexplore.errors import UsageError
from flyexplore.insight.capture import DECOMPOSED_RMSNORM, Call, Capture, module_pattern
from flyexplore.insight.explain import compile_options_for, explain, explain_text
from flyexplore.insight.fusion import fused_reason
from flyexplore.ops import get_op, model_hooks
from flyexplore.ops.attention.model import shape_text
from flyexplore.ops.gemm.model import operands
from flyexplore.ops.grouped_gemm.model import nt_expert_weight as _nt
from flyexplore.world.conditions import TensorDesc, contiguous_strides
from flyexplore.world.facts import facts

#: Verdict words, best first.
STATUSES = ("eligible", "unverified", "not eligible", "no FlyDSL path")
#: Said of every eligible compiled GEMM (:data:`flyexplore.insight.explain.COMPILE_NOTES`).
AUTOTUNE_NOTE = ("eligible = FlyDSL is an autotune candidate: max-autotune benchmarks it against the other "
                 "GEMM backends and may still choose another kernel")


@dataclass(frozen=True)
class Verdict:
    """The judgement of one distinct call: ``status`` (:data:`STATUSES`), ``category`` (one short
    label to group calls by: ``"eligible"`` or the first failed rule, e.g. ``"grouped_gemm: B
    contiguous"``), ``reason`` (one line), ``kernel`` (FlyDSL kernel family when eligible),
    ``explanation`` (the :class:`~flyexplore.world.conditions.Explanation`, ``None`` when there is no
    FlyDSL path), ``notes``."""

    status: str
    category: str
    reason: str
    kernel: str | None = None
    explanation: Any = None
    notes: tuple[str, ...] = ()


@dataclass
class Judged:
    """A capture's distinct calls with their verdicts: ``rows`` of ``(call, count, verdict)``,
    ``advice`` (:func:`what_if`), ``capture``."""

    capture: Capture
    rows: list[tuple[Call, int, Verdict]] = field(default_factory=list)
    advice: list[dict] = field(default_factory=list)


def _env(arch: str, compiled: bool):
    opts = compile_options_for("gemm", None) if compiled else None
    return facts(arch=arch, assume_rocm=True, compile_options=opts)


class Envs:
    """The two judging environments of one arch, made once."""

    def __init__(self, arch: str):
        self.arch = arch
        self._e: dict[bool, Any] = {}

    def __call__(self, compiled: bool):
        if compiled not in self._e:
            self._e[compiled] = _env(self.arch, compiled)
        return self._e[compiled]


def _category(family: str, ex) -> str:
    if ex.taken:
        return "eligible"
    failed = ex.failed
    return f"{family}: {failed[0].name}" if failed else f"{family}: unverified"


def _from_explanation(family: str, ex, extra_notes: Sequence[str] = ()) -> Verdict:
    notes = tuple(extra_notes)
    verdict = getattr(ex, "verdict", None)
    if verdict is not None:  # attention: eligible / not eligible / unverified
        st = {"eligible": "eligible", "not eligible": "not eligible"}.get(verdict, "unverified")
        cat = "eligible" if st == "eligible" else (_category(family, ex) if st == "not eligible"
                                                   else f"{family}: unverified (needs the GPU)")
        return Verdict(st, cat, ex.reason, ex.kernel, ex, notes)
    compiled = _route(family) == "compile"
    if ex.taken:
        reason = (f"eligible: {ex.kernel} is an autotune candidate" if compiled
                  else f"eligible: FlyDSL {ex.kernel} runs it")
        return Verdict("eligible", "eligible", reason, ex.kernel, ex, notes)
    reason = "not eligible: " + "; ".join(c.detail for c in ex.failed)
    return Verdict("not eligible", _category(family, ex), reason, ex.kernel, ex, notes)


def _route(family: str) -> str | None:
    try:
        p = get_op(family).flydsl
    except UsageError:
        return None
    return p.route if p is not None else None


def _gemm(a: TensorDesc, b: TensorDesc, bias: bool, envs: Envs):

    return explain("gemm", env=envs(True), a=a, b=b, bias=bias)


def gemm_operands(c: Call) -> tuple[TensorDesc, TensorDesc]:
    """A [M, K] and B [K, N] of a captured ``aten.mm`` or ``aten.addmm`` (whose first argument
    is the bias): the GEMM family's :func:`flyexplore.ops.gemm.model.operands`."""
    return operands(c)


def _judge_gemm(c: Call, envs: Envs, bias: bool | None = None):
    """The compile rules on a captured mm / addmm; ``bias`` (default: addmm has one, and so has an
    eager mm a compiled run fuses into addmm, ``Call.fused``) to re-judge."""
    a, b = gemm_operands(c)
    if bias is None:
        bias = c.op == "aten.addmm.default" or c.fused == "addmm"
    return _fused(c, _gemm(a, b, bias, envs))


def _fused(c: Call, ex):
    """``ex`` with its failed "no bias" rule said as what it is for a GEMM made by Inductor's
    post-grad addmm fusion (:func:`flyexplore.insight.fusion.fused_reason`: a residual add fused
    into addmm is no bias of the model's); other calls unchanged."""
    why = fused_reason(c.note) if c.op in ("aten.addmm.default", "aten.mm.default") else None
    conds = getattr(ex, "conditions", None)
    if why is None or conds is None:
        return ex
    return replace(ex, conditions=tuple(replace(cd, name="addmm fusion", detail=why)
                                        if cd.name == "no bias" and cd.ok is False else cd for cd in conds))


def _grouped(a, b, offs, bias, envs: Envs):

    return explain("grouped_gemm", env=envs(True), a=a, b=b, offs=offs if offs is not None else None,
                   bias=bias is not None)


def _rms(x, w, eps, envs: Envs, ns=None):

    return explain("rmsnorm", env=envs(False), x=x, normalized_shape=tuple(ns) if ns else (x.shape[-1],),
                   weight=w, eps=eps)


def _topk(c: Call, envs: Envs, x=None):

    g = c.scalars
    return explain("topk", env=envs(False), x=x or c.arg("self"), k=int(g.get("k")), dim=int(g.get("dim", -1)),
                   largest=bool(g.get("largest", True)), sorted=bool(g.get("sorted", True)))


def attention_shape(c: Call) -> str:
    """The attention catalogue's shape text of a captured SDPA call,
    ``BxHxSQxSKVxD[:hkv=N,causal=1]`` (the attention family's
    :func:`flyexplore.ops.attention.model.shape_text`)."""
    return shape_text(c)


def judge_call(c: Call, view: str, envs: Envs) -> Verdict:
    """The verdict for one captured call in ``view``, as its family's model hooks say
    (:attr:`flyexplore.ops.base.ModelHooks.judge`): a verdict decided without the rules, or the
    family's FlyDSL rules on the arguments the hook gives (the explainer, as ``flyexplore
    explain --assume-rocm`` judges; the compile route in the compiled environment of
    :class:`Envs`). A call no family claims has no FlyDSL path."""
    fam = c.family
    hooks = model_hooks(fam)
    if hooks is None or hooks.judge is None:
        return Verdict("no FlyDSL path", f"no FlyDSL path: {_kind(c.op)}", f"no FlyDSL path for {c.op}")
    got = hooks.judge(c, view)
    if got is None:
        return Verdict("no FlyDSL path", f"no FlyDSL path: {_kind(c.op)}", f"no FlyDSL path for {c.op}")
    if got.status is not None:
        return Verdict(got.status, got.category, got.reason, notes=tuple(got.notes))
    path = get_op(fam).flydsl
    args = dict(got.args)
    if path is None:
        return Verdict("no FlyDSL path", f"no FlyDSL path: {fam}", f"no FlyDSL path: {fam} has no FlyDSL route")
    if path.judge is None and path.explain_text is not None:   # a family with its own front door
        ex = explain_text(fam, args.pop("shape"), args.pop("dtype", None), arch=envs.arch, **args)
    else:
        ex = _fused(c, explain(fam, env=envs(path.route == "compile"), **args))
    notes = tuple(got.notes)
    if path.route == "compile" and getattr(ex, "taken", False):
        notes += (AUTOTUNE_NOTE,)
    return _from_explanation(fam, ex, notes)


def _kind(op: str) -> str:
    """A short group for ops without a FlyDSL path: the ATen name without overload."""
    parts = op.split(".")
    return parts[1] if len(parts) >= 2 else op


def judge_capture(cap: Capture, envs: Envs | None = None, advice: bool = True) -> Judged:
    """Every distinct kernel call of ``cap`` (:meth:`Capture.distinct`) with its :class:`Verdict`,
    and the :func:`what_if` advice. ``envs``: judging environments to share between captures."""
    envs = envs or Envs(cap.arch)
    j = Judged(cap)
    for c, n in cap.distinct():
        j.rows.append((c, n, judge_call(c, cap.view, envs)))
    if advice:
        j.advice = what_if(j, envs)
    return j


# -- what-if ---------------------------------------------------------------------------------

def nt_expert_weight(b: TensorDesc) -> bool:
    """B of ``_grouped_mm`` passed as ``w.transpose(-2, -1)`` of a contiguous [G, N, K] ``w``
    (the grouped GEMM family's :func:`flyexplore.ops.grouped_gemm.model.nt_expert_weight`)."""
    return _nt(b)


@dataclass(frozen=True)
class Rule:
    """One what-if: ``applies(call, verdict, view)``, ``change(call)`` -> a function that
    re-judges the changed call (returns an Explanation), ``text`` (what to change in the model
    code), ``what`` (the calls it is about)."""

    name: str
    text: str
    what: str
    views: tuple[str, ...]
    applies: Callable[[Call, Verdict], bool]
    rejudge: Callable[[Call, Envs], Any]


def _contig(t: TensorDesc) -> TensorDesc:
    return replace(t, stride=contiguous_strides(t.shape), storage_offset=0)


def _rms_rows(c: Call):
    x = c.arg("input")
    n = x.shape[-1]
    m = 1
    for s in x.shape[:-1]:
        m *= s
    return m, n


RULES: tuple[Rule, ...] = (
    Rule("expert_weights_gkn",
         "store the expert weights as [G, K, N] (transformers experts with is_transposed=True, as gpt-oss does), "
         "so _grouped_mm gets a contiguous B",
         "expert grouped GEMM calls", ("compiled",),
         lambda c, v: c.op == "aten._grouped_mm.default" and v.status != "eligible" and nt_expert_weight(c.arg("mat2")),
         lambda c, e: _grouped(c.arg("self"), _contig(c.arg("mat2")), c.arg("offs"), c.arg("bias"), e)),
    Rule("fused_rms_norm",
         "compute RMSNorm with F.rms_norm (torch.nn.RMSNorm) instead of pow/mean/rsqrt, so it reaches "
         "aten._fused_rms_norm",
         "RMSNorm calls", ("eager",),
         lambda c, v: c.op == DECOMPOSED_RMSNORM and c.arg("input") is not None,
         lambda c, e: _rms(_contig(c.arg("input")), c.arg("weight"), c.scalars.get("eps") or 1e-6, e)),
    Rule("no_gemm_bias",
         "keep the bias out of the GEMM (Linear(bias=False) plus a separate add)",
         "GEMM calls with a bias", ("compiled",),
         lambda c, v: c.op == "aten.addmm.default" and v.status != "eligible" and "post-grad" not in c.note,
         lambda c, e: _judge_gemm(c, e, bias=False)),
    Rule("bf16_gemm",
         "run the model in bf16 (FlyDSL's GEMM templates take fp16/bf16)",
         "fp32 GEMM calls", ("compiled",),
         lambda c, v: c.op == "aten.mm.default" and v.status != "eligible" and c.dtype == "fp32",
         lambda c, e: _gemm(replace(c.arg("self"), dtype=_bf16()), replace(c.arg("mat2"), dtype=_bf16()), False, e)),
    Rule("fp32_topk",
         "take the TopK of fp32 scores (the FlyDSL TopK takes fp32 only)",
         "TopK calls", ("eager", "compiled"),
         lambda c, v: c.family == "topk" and v.status != "eligible" and c.arg("self") is not None
         and c.arg("self").dtype.is_floating_point and c.dtype != "fp32",
         lambda c, e: _topk(c, e, x=replace(c.arg("self"), dtype=_fp32()))),
    Rule("torch_compile",
         "run the model under torch.compile(mode='max-autotune') with FLYDSL in max_autotune_gemm_backends",
         "GEMM calls (eager)", ("eager",),
         lambda c, v: c.op in ("aten.mm.default", "aten.addmm.default", "aten._grouped_mm.default")
         and v.category.endswith("need torch.compile)"),
         lambda c, e: (_grouped(c.arg("self"), c.arg("mat2"), c.arg("offs"), c.arg("bias"), e)
                       if c.op == "aten._grouped_mm.default" else _judge_gemm(c, e))),
)


def _bf16():
    import torch
    return torch.bfloat16


def _fp32():
    import torch
    return torch.float32


def what_if(j: Judged, envs: Envs) -> list[dict]:
    """For each :data:`RULES` entry that applies to calls of ``j``: re-judge every such call
    changed, and say what they come to. Each item: ``rule``, ``change`` (what to change),
    ``calls`` (how many calls it touches, counts included), ``eligible_after`` (how many of them
    the re-judged rules make eligible), ``examples`` (up to three ``{module, before, after}``),
    ``text`` (one line, e.g. ``store the expert weights as [G, K, N] ...: 96 of 96 expert grouped
    GEMM calls eligible``; or ``... still not eligible: <first reason>``), ``kind="what-if"``.
    Statements derived from the capture follow, ``kind="note"`` (nothing re-judged): fp32 GEMMs
    in a bf16/fp16 model (:func:`model_dtype`) are deliberate fp32 islands, not advised to bf16;
    experts run as bmm over every expert with every token (:func:`experts_as_bmm`)."""
    out = []
    mdt = model_dtype(j.capture)
    for rule in RULES:
        if j.capture.view not in rule.views:
            continue
        hits = [(c, n, v) for c, n, v in j.rows if rule.applies(c, v)]
        if rule.name == "bf16_gemm" and mdt not in (None, "fp32"):
            out.append(_fp32_islands(j, hits, mdt)) if hits else None
            continue   # fp32 GEMMs in a bf16/fp16 model are there on purpose: not advised away
        if not hits:
            continue
        total = sum(n for _, n, _ in hits)
        ok, ex = 0, []
        reasons: dict[str, int] = {}
        for c, n, v in hits:
            after = rule.rejudge(c, envs)
            good = bool(getattr(after, "taken", False))
            after_v = _from_explanation(c.family or "", after)
            ok += n if good else 0
            if not good:
                r = after_v.reason.replace("not eligible: ", "")
                reasons[r] = reasons.get(r, 0) + n
            if len(ex) < 3:
                ex.append({"module": c.module, "shapes": c.shapes(), "before": v.reason, "after": after_v.reason})
        text = f"{rule.text}: {ok} of {total} {rule.what} eligible"
        if ok < total:
            worst = max(reasons, key=reasons.get)
            text += f"; still not eligible: {worst}" if ok == 0 else f"; the others still not: {worst}"
        out.append({"rule": rule.name, "kind": "what-if", "change": rule.text, "view": j.capture.view, "phase": j.capture.phase,
                    "step": j.capture.step,
                    "model": j.capture.meta.get("model", j.capture.label), "calls": total,
                    "eligible_after": ok, "examples": ex, "text": text})
    experts = experts_as_bmm(j)
    if experts:
        out.append(experts)
    return out


def model_dtype(cap: Capture) -> str | None:
    """The dtype the model runs in: ``cap.meta["dtype"]`` when the capture recorded it, else the
    dtype of most GEMM FLOPs (``mm``/``addmm``/``bmm``/grouped, whatever their family), ``None``
    without GEMMs."""
    if cap.meta.get("dtype"):
        return str(cap.meta["dtype"])
    acc: dict[str, float] = {}
    for c in cap.kernel_calls():
        if c.op in ("aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten._grouped_mm.default") \
                and c.flops == c.flops:
            acc[c.dtype] = acc.get(c.dtype, 0.0) + c.flops
    return max(acc, key=acc.get) if acc else None


def _fp32_islands(j: Judged, hits, mdt: str) -> dict:
    """The advice item for fp32 GEMM calls in a model that runs in ``mdt`` (bf16/fp16): computed
    in fp32 on purpose (e.g. DeepSeek-V2/V3's MoE router ``mlp.gate`` upcasts its input and weight,
    transformers' ``DeepseekV3TopkRouter``), so "run the model in bf16" does not apply."""
    total = sum(n for _, n, _ in hits)
    mods = sorted({module_pattern(c.module) for c, _, _ in hits})
    shown = ", ".join(mods[:3]) + (f" and {len(mods) - 3} more" if len(mods) > 3 else "")
    text = (f"{total} fp32 GEMM calls ({shown}) in a model that runs in {mdt}: deliberate fp32 islands "
            "(computed in fp32 on purpose, as MoE routers are); left as they are, not advised")
    return {"rule": "fp32_islands", "kind": "note", "change": "", "view": j.capture.view, "phase": j.capture.phase,
            "step": j.capture.step, "model": j.capture.meta.get("model", j.capture.label), "calls": total,
            "eligible_after": 0, "examples": [{"module": c.module, "shapes": c.shapes(), "before": v.reason,
                                               "after": "unchanged (fp32 on purpose)"} for c, _, v in hits[:3]],
            "text": text}


def experts_as_bmm(j: Judged) -> dict | None:
    """A statement (not a what-if) when a MoE's experts run as ``aten.bmm`` over every expert with
    all of the step's tokens, as transformers' Llama-4 experts do (``Llama4TextExperts``: every
    token goes through every expert, then the router's scores weight the results): the
    calls, their share of the step's FLOPs and what it means; ``None`` otherwise. Derived from
    the captured calls (modules whose class name ends in ``Experts``), never assumed."""
    tokens = j.capture.meta.get("tokens")
    rows = [(c, n, v) for c, n, v in j.rows if c.op in ("aten.bmm.default", "aten.baddbmm.default")
            and c.module_type.endswith("Experts")]
    if not rows or not tokens:
        return None
    hits = []
    for c, n, v in rows:
        a = c.inputs[1] if c.op == "aten.baddbmm.default" else c.inputs[0]
        if a is not None and a.ndim == 3 and a.shape[1] == tokens:
            hits.append((c, n, v, a.shape[0]))
    if not hits:
        return None
    flops = sum(c.flops * n for c, n, _, _ in hits)
    total = sum(c.flops * n for c, n, _ in j.rows if c.flops == c.flops)
    g = hits[0][3]
    top_k = next((e.get("top_k") for e in j.capture.meta.get("experts", ()) if e.get("top_k")), None)
    work = f"{g // top_k}x the work of its top-{top_k} routing" if top_k else f"{g}x the work of top-1 routing"
    calls = sum(n for _, n, _, _ in hits)
    text = (f"the experts ({hits[0][0].module_type}) run as aten.bmm over all {g} experts with all {tokens} tokens "
            f"each: every token goes through every expert ({work}; {calls} calls, "
            f"{flops / total:.0%} of this step's FLOPs); this is the model code's choice, not a routing assumption, "
            "and bmm has no FlyDSL path")
    return {"rule": "experts_bmm_all_tokens", "kind": "note", "change": "", "view": j.capture.view, "phase": j.capture.phase,
            "step": j.capture.step, "model": j.capture.meta.get("model", j.capture.label), "calls": calls,
            "eligible_after": 0, "examples": [{"module": c.module, "shapes": c.shapes(), "before": v.reason,
                                               "after": ""} for c, _, v, _ in hits[:3]],
            "text": text, "flops_share": flops / total if total else None}
