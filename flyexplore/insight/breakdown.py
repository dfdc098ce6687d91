"""Where one model step's time goes: :func:`profile_step` runs a zero-argument step once under
``torch.profiler`` and splits its time by kernel category -- the operator families with model
hooks (:func:`flyexplore.ops.model_families`: gemm, rmsnorm, topk, grouped_gemm, scaled_gemm,
attention), then ``other``, then ``idle`` -- the category names of the model capture
(``Call.family`` in :mod:`flyexplore.insight.capture`), so measured shares sit beside modelled ones.

Each device kernel (GPU) or CPU op (CPU) is attributed by the first rule that answers:

1. module ranges (eager, ``module=`` given): a forward of a module some family keeps as one call
   (:attr:`~flyexplore.ops.base.ModelHooks.keep_module`, e.g. Hugging Face's ``LlamaRMSNorm``) runs
   inside ``record_function("flyexplore::<family>")``; what is launched inside belongs to it;
2. the ATen op that launched it (its ``cpu_parent`` chain, innermost family op first): the
   families' ``aten_ops`` and kept functions, plus the ops in :data:`ATEN_EXTRA`;
3. the kernel's name (compiled code: Inductor's Triton kernels, extern calls): :func:`category_of_kernel`.

A kernel with no family op above its launch -- a CUDA graph replay's kernels hang under
``cudaGraphLaunch``, Inductor's under its own ranges -- falls to rule 3 (its name).

``idle`` is device time inside the call's span (first kernel start to last kernel end) with no
kernel running: launch gaps and host overhead. On a GPU it comes from a step profiled with device
activity only (after one traced warm-up step), each gap less the profiler's own host cost per
launch measured on the device with a burst of one-element kernels (:func:`launch_cost_us`,
:func:`corrected_idle`): the profiler delays every launch, and a step of many short kernels (a
decode) otherwise profiles longer than it runs. That burst's cost is smaller than a real step's:
on the lent H100 a host-launched decode at batch 1 still profiled 46-213% long, where a CUDA graph
replay (``graph=True``: its gaps kept as profiled) was within 3.2-4.4%
(``data/h100/model_measure/``). On a CPU there are no device kernels: each CPU
event's self time (children excluded) goes to the category of the innermost range or family op
above it, and there is no idle row.
"""
from __future__ import annotations

import contextlib
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Callable

from flyexplore.errors import UsageError, bad_choice
from flyexplore.insight.kernels import AOTRITON_KERNELS, kernel_head
from flyexplore.ops import get_op, model_families

OTHER, IDLE = "other", "idle"
_RANGE = "flyexplore::"                  # module ranges: flyexplore::<family>
_STEP = "flyexplore::profiled step"      # the profiled call
_COLS = ("category", "us", "share", "kernels", "launches", "top")

#: ATen ops whose work is a family's though its hooks do not name them: the backends
#: ``aten::scaled_dot_product_attention`` dispatches to (ATen ``native_functions.yaml``), which
#: Inductor also calls directly as extern kernels; ``aten::rms_norm``, the composite above
#: ``aten::_fused_rms_norm``. Names absent from this torch are ignored.
ATEN_EXTRA = {
    "attention": ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                  "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
                  "_scaled_dot_product_attention_math", "_scaled_dot_product_attention_math_for_mps",
                  "_scaled_dot_product_fused_attention_overrideable", "_flash_attention_forward",
                  "_efficient_attention_forward", "_cudnn_attention_forward"),
    "rmsnorm": ("rms_norm",),
}
#: ATen ops that answer rule 2 with "other": a sort launches the sort kernels ATen's topk also
#: uses (``radixSortKVInPlace``, ``bitonicSortKVInPlace``), which the name rule would call topk.
NOT_FAMILY = ("aten::sort", "aten::argsort", "aten::msort")
#: Composite ops that are GEMM work when a GEMM op (``aten::mm``/``addmm``/``bmm``) runs inside them.
GEMM_WRAPPERS = ("aten::linear", "aten::matmul", "aten::einsum")

# Rule 3, on the kernel's head (kernels.kernel_head): (category, pattern, source). First match
# wins, so grouped / scaled GEMM and attention come before GEMM (their names can contain "mm").
_AOT = "|".join(sorted({n for names in AOTRITON_KERNELS.values() for n in names}))
_NAME_RULES = tuple((c, re.compile(p)) for c, p, _why in (
    ("grouped_gemm", r"grouped_(mm|gemm)", "ATen's _grouped_mm kernels; Inductor names kernels after their ops"),
    ("scaled_gemm", r"_scaled_mm|scaled_gemm", "Inductor's triton_tem_fused__scaled_mm_<n>"),
    ("attention", r"^pytorch_flash::|^flash(::|_fwd|_bwd|_attn)|(?i:fmha)", "flash-attention, CUTLASS/CK/aiter fmha"),
    ("attention", r"^cudnn_generated_fort_native_sdpa", "cuDNN's generated SDPA kernels"),
    ("attention", rf"^({_AOT})$", "AOTriton's kernel names, flyc included (kernels.AOTRITON_KERNELS)"),
    ("attention", r"^triton_tem_fused\w*(flex|attention)", "Inductor's flex-attention template"),
    ("gemm", r"^nvjet_|xmma_gemm|^cublasLt", "cuBLAS nvjet / xmma kernels, cuBLASLt"),
    ("gemm", r"^(ampere|volta|turing|hopper|maxwell|sm\d+)_\w*gem[mv]", "cuBLAS arch-prefixed GEMMs"),
    ("gemm", r"^(gemv2[NT]_kernel|gemvx|gemmSN_|gemmk1_kernel|splitKreduce_kernel|gemm_kernel_splitk)",
     "cuBLAS helper kernels"),
    ("gemm", r"^cutlass\w*gemm|^cutlass::\w*[Gg]emm", "CUTLASS GEMM instantiations"),
    ("gemm", r"^Cijk_|(?i:hipblaslt)|^rocblas_\w*gem[mv]", "Tensile (hipBLASLt/rocBLAS) naming"),
    # a pointwise or reduction kernel (triton_poi_/triton_red_/triton_per_) is named after every op it
    # fused, the mm whose output it reads included: only a template (triton_tem_) does the GEMM
    ("gemm", r"^triton_tem_\w*?_(mm|addmm|bmm|baddbmm)(_|$)", "Inductor's mm templates, triton_tem_fused_mm_<n>"),
    ("rmsnorm", r"^(?=triton_\w*rsqrt)(?=triton_\w*(mean|pow))", "Inductor's fused RMSNorm reductions"),
    ("topk", r"(?i:topk)|radixSort|gatherTopK|bitonicSort", "ATen's sbtopk/mbtopk and sort kernels"),
))
# CUTLASS's generic wrappers name the operation only in their template argument.
_WRAPPER = re.compile(r"^cutlass::(Kernel\d*|device_kernel)$")


def categories() -> tuple[str, ...]:
    """The categories, in report order: the families with model hooks
    (:func:`flyexplore.ops.model_families` order), then ``"other"``, then ``"idle"``."""
    return tuple(model_families()) + (OTHER, IDLE)


def category_of_kernel(name: str) -> str:
    """Rule 3 alone: the category of a device kernel by its name as ``torch.profiler`` reports it
    (``"nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT"`` -> ``"gemm"``). A family's own FlyDSL kernel
    patterns (``op.flydsl.kernels``) first, then the naming conventions of cuBLAS, CUTLASS,
    Tensile, flash-attention, cuDNN, AOTriton, Inductor and ATen; ``"other"`` when none matches."""
    fams = model_families()
    head = kernel_head(name.replace("(anonymous namespace)", "anonymous"))
    for fam in fams:
        path = get_op(fam).flydsl
        if path is not None and any(re.search(k.regex, head) for k in path.kernels):
            return fam
    if _WRAPPER.match(head) and "<" in name:
        head = name[name.index("<") + 1:]
    return next((c for c, pat in _NAME_RULES if c in fams and pat.search(head)), OTHER)


def _aten_tables() -> tuple[dict[str, str], dict[str, str]]:
    """Rule 2's ``{"aten::mm": "gemm", ...}`` (profiler names, no overload), and the ops kept as
    one call (a family's kept function -- a torch function is the ATen op of its name -- and
    :data:`ATEN_EXTRA`): what runs inside one is its family's, as the capture keeps it (the bmm of
    SDPA's math backend is attention, not gemm)."""
    import torch

    table: dict[str, str] = {}
    kept: dict[str, str] = {}
    for fam, op in model_families().items():
        hooks = op.model
        for a in hooks.aten_ops:
            if a.startswith("aten."):
                table.setdefault(f"aten::{a.split('.')[1]}", fam)
        names = [n for n in ATEN_EXTRA.get(fam, ()) if hasattr(torch.ops.aten, n)]
        if hooks.keep_function is not None:
            names.append(getattr(hooks.keep_function[0](), "__name__", ""))
        for n in filter(None, names):
            kept.setdefault(f"aten::{n}", fam)
    for n, fam in kept.items():
        table.setdefault(n, fam)
    return table, kept


@dataclass(frozen=True)
class Breakdown:
    """One profiled call split by category. ``rows``: one dict per category present, in
    :func:`categories` order: ``category``, ``us`` (µs), ``share`` (0..1), ``kernels`` (distinct
    kernel or op names), ``launches``, ``top`` (the 3 largest names by time, ``"name (us)"``).
    ``kernel_us``: device kernel time (GPU) or attributed CPU-op self time (CPU). ``span_us``: the
    call's span (first kernel start to last kernel end on a GPU; its CPU wall time on a CPU).
    ``idle_us``: ``span_us`` less the busy time (the union of kernel intervals, overlapping streams
    counted once); 0 on a CPU. ``device``: ``"cuda"`` or ``"cpu"``. ``attribution``: the rules that
    decided, in words. Shares are of ``kernel_us + idle_us`` (GPU) or of ``kernel_us`` (CPU)."""

    rows: tuple[dict, ...]
    kernel_us: float
    span_us: float
    idle_us: float
    device: str
    attribution: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def share(self, category: str) -> float:
        """The share (0..1) of ``category``; 0.0 when it has no row."""
        return next((r["share"] for r in self.rows if r["category"] == category), 0.0)

    def to_dict(self) -> dict:
        """JSON-able; :meth:`from_dict` rebuilds the same object."""
        return {"rows": [{**r, "top": list(r["top"])} for r in self.rows], "kernel_us": self.kernel_us,
                "span_us": self.span_us, "idle_us": self.idle_us, "device": self.device,
                "attribution": list(self.attribution), "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, d: dict) -> "Breakdown":
        rows = tuple({**{k: r[k] for k in _COLS}, "top": tuple(r["top"])} for r in d["rows"])
        return cls(rows, float(d["kernel_us"]), float(d["span_us"]), float(d["idle_us"]), d["device"],
                   tuple(d.get("attribution", ())), tuple(d.get("notes", ())))

    def text(self) -> str:
        """An aligned table (category, µs, share %, launches, top names), then the totals and notes."""
        w = max([len("category")] + [len(r["category"]) for r in self.rows])
        lines = [f"{'category':<{w}}  {'us':>10}  {'share':>6}  {'launches':>8}  top"]
        for r in self.rows:
            lines.append(f"{r['category']:<{w}}  {r['us']:>10.1f}  {100 * r['share']:>5.1f}%  "
                         f"{r['launches']:>8}  {', '.join(r['top'])}")
        lines.append(f"{self.device}: kernels {self.kernel_us:.1f} us, span {self.span_us:.1f} us, idle "
                     f"{self.idle_us:.1f} us" if self.device == "cuda" else
                     f"cpu: CPU-op self time {self.kernel_us:.1f} us, call {self.span_us:.1f} us")
        lines += [f"attribution: {a}" for a in self.attribution] + [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


@contextlib.contextmanager
def _module_ranges(module):
    """Forward pre/post hooks putting each kept module's forward in ``flyexplore::<family>``;
    yields how many modules are hooked; removed on exit, also on an error."""
    import torch

    handles, hooked = [], 0
    try:
        fams = [(n, op.model.keep_module) for n, op in model_families().items() if op.model.keep_module]
        for m in (module.modules() if module is not None else ()):
            fam = next((n for n, keep in fams if keep(m) is not None), None)
            if fam is None:
                continue
            stack: list = []

            def pre(mod, args, _stack=stack, _name=f"{_RANGE}{fam}"):
                rf = torch.profiler.record_function(_name)
                rf.__enter__()
                _stack.append(rf)

            def post(mod, args, out, _stack=stack):
                if _stack:
                    _stack.pop().__exit__(None, None, None)

            handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post, always_call=True)]
            hooked += 1
        yield hooked
    finally:
        for h in handles:
            h.remove()


def profile_step(fn: Callable[[], Any], device="cpu", *, module=None, warmup: int = 1,
                 graph: bool = False) -> Breakdown:
    """Run ``fn`` ``warmup`` times unprofiled, then once under ``torch.profiler`` (CPU activity,
    plus CUDA -- ROCm included -- on a ``"cuda"`` device, synchronized), and split that call's
    time by :func:`categories`. ``module``: the eager ``nn.Module`` the step runs, for module
    ranges (rule 1); leave it ``None`` for a compiled callable (hooks would force a recompile).
    ``graph``: ``fn`` replays a CUDA/HIP graph, whose kernels the host does not launch one by one,
    so its gaps are kept as profiled (not lessened by the per-launch cost, :func:`corrected_idle`);
    gaps outside the replay (a graph-trees step's host work and input copies) are profiled as they
    are, the profiler's cost included.
    Returns a :class:`Breakdown` (times in µs of that one call). Raises :class:`UsageError` for a non-callable ``fn``, a device other than CPU or CUDA, or a
    negative ``warmup``."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    if not callable(fn):
        raise UsageError(f"profile_step needs a zero-argument callable, got {type(fn).__name__}")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise UsageError(f"bad device {device!r}: {exc}") from None
    if dev.type not in ("cpu", "cuda"):
        raise bad_choice("device type", dev.type, ("cpu", "cuda"))
    if int(warmup) < 0:
        raise UsageError(f"warmup must be >= 0, got {warmup}")
    gpu = dev.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(dev)) if gpu else (lambda: None)
    for _ in range(int(warmup)):
        fn()
    sync()
    with _module_ranges(module) as hooked:
        with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])) as prof:
            with record_function(_STEP):
                fn()
            sync()
    bd = _breakdown(list(prof.events()), gpu, hooked)
    if not gpu:
        return bd
    # The launch gaps of a second step profiled with device activity only: recording every CPU op
    # (what attributes the kernels above) slows the host's launches and so lengthens the gaps of a
    # host-heavy step; the kernels' own durations do not change.
    # Profiled twice in one session, the first discarded (torch.profiler's schedule: one warm-up step
    # traced, then one recorded): the profiler's first sight of each kernel (its one-time setup per
    # kernel) falls in the warm-up step, not in the gaps read.
    once = schedule(wait=0, warmup=1, active=1, repeat=1)
    with profile(activities=[ProfilerActivity.CUDA], schedule=once) as light:
        for _ in range(2):
            fn()
            sync()
            light.step()
    kern = _device_kernels(list(light.events()))
    span, busy = _span_busy(kern)
    if not busy:
        return bd
    raw = max(span - busy, 0.0)
    cost = 0.0 if graph else launch_cost_us(dev)
    idle = corrected_idle(_gaps(kern), cost)
    total = bd.kernel_us + idle
    rows = tuple({**r, "us": idle if r["category"] == IDLE else r["us"]} for r in bd.rows)
    rows = tuple({**r, "share": r["us"] / total if total > 0 else 0.0} for r in rows)
    how = ("a graph replay's gaps, kept as profiled (one launch replays every kernel)" if graph else
           f"each less the profiler's own host cost per launch measured on this device ({cost:.2f} us, "
           ":func:`launch_cost_us`)")
    notes = tuple(n for n in bd.notes if not n.startswith("idle is measured")) + (
        f"idle: the launch gaps of a step profiled with device activity only (after one traced warm-up "
        f"step), {how}: {idle:.1f} us "
        f"({raw:.1f} us as profiled; {bd.idle_us:.1f} us in the step that recorded the CPU ops)",)
    return Breakdown(rows, bd.kernel_us, float(bd.kernel_us + idle), float(idle), bd.device, bd.attribution, notes)


def _gaps(kern: list) -> list[float]:
    """The idle gaps between a profile's kernels, µs: each stretch of the span with no kernel
    running (kernels on several streams merged first)."""
    iv = sorted((k.time_range.start, k.time_range.end) for k in kern)
    out, end = [], None
    for s, e in iv:
        if end is not None and s > end:
            out.append(float(s - end))
        end = e if end is None else max(end, e)
    return out


def corrected_idle(gaps: list[float], per_launch_us: float) -> float:
    """The idle time of an unprofiled step from a profiled step's ``gaps`` (µs, :func:`_gaps`):
    each gap less ``per_launch_us``, the profiler's own host cost per launch, floored at 0. A gap
    is the GPU waiting for the next launch; under the profiler that launch was late by the
    profiler's cost, so a step of many short kernels (a decode: about 1,300 launches) profiles
    longer than it runs. A gap shorter than the cost was not host-bound: nothing of it is kept."""
    c = max(float(per_launch_us), 0.0)
    return float(sum(max(g - c, 0.0) for g in gaps))


def launch_cost_us(device, n: int = 400) -> float:
    """The profiler's own host cost per kernel launch on ``device`` (a CUDA device), µs: ``n``
    launches of a one-element kernel back to back, timed by wall clock unprofiled and under
    ``torch.profiler`` with device activity only (as :func:`profile_step`'s second step), the
    difference per launch (median of 3 tries, 0 at least). GPU only; 0.0 on a CPU."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    dev = torch.device(device)
    if dev.type != "cuda":
        return 0.0
    x = torch.zeros(1, device=dev)

    def burst() -> float:
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(n):
            x.add_(1.0)
        torch.cuda.synchronize(dev)
        return time.perf_counter() - t0

    burst()
    diffs = []
    for _ in range(3):
        plain = burst()
        with profile(activities=[ProfilerActivity.CUDA]):
            prof = burst()
        diffs.append((prof - plain) / n * 1e6)
    return max(sorted(diffs)[1], 0.0)


def _device_kernels(events: list) -> list:
    """The device kernels of a profile's events (user annotations left out)."""
    from torch.autograd import DeviceType

    return [e for e in events if e.device_type != DeviceType.CPU and not e.is_user_annotation
            and "annotation" not in str(getattr(e, "activity_type", "") or "")]


def _span_busy(kern: list) -> tuple[float, float]:
    """(first start to last end, the union of the kernels' intervals), µs: busy time counts
    kernels that overlap on several streams once."""
    iv = sorted((k.time_range.start, k.time_range.end) for k in kern)
    busy, end = 0.0, float("-inf")
    for s, e in iv:
        if e > end:
            busy += e - max(s, end)
            end = e
    return (end - iv[0][0] if iv else 0.0), busy


def _breakdown(events: list, gpu: bool, hooked: int) -> Breakdown:
    from torch.autograd import DeviceType

    fams, (table, kept) = model_families(), _aten_tables()
    cpu = [e for e in events if e.device_type == DeviceType.CPU and not e.is_async]
    root = next((e for e in cpu if e.name == _STEP), None)
    gemm_ops: dict[int, bool] = {}

    def has_gemm(e) -> bool:  # a GEMM op at or below e (memoized)
        if id(e) not in gemm_ops:
            gemm_ops[id(e)] = table.get(e.name) == "gemm" or any(has_gemm(c) for c in e.cpu_children)
        return gemm_ops[id(e)]

    def attribute(e):  # (category, rule) from e's chain, innermost first; None: no rule answered
        chain = []
        while e is not None:
            chain.append(e)
            e = e.cpu_parent
        for c in chain:
            if c.name.startswith(_RANGE) and c.name[len(_RANGE):] in fams:
                return c.name[len(_RANGE):], "module"
        for c in reversed(chain):   # the outermost op kept as one call
            if c.name in kept:
                return kept[c.name], "aten"
        for c in chain:             # else the innermost family op
            if c.name in NOT_FAMILY:
                return OTHER, "aten"
            fam = table.get(c.name) or ("gemm" if c.name in GEMM_WRAPPERS and has_gemm(c) else None)
            if fam in fams:
                return fam, "aten"
        return None

    us, names, launches, used = defaultdict(float), defaultdict(Counter), Counter(), Counter()

    def add(cat, name, t, rule, n=1):
        us[cat] += t
        names[cat][name] += t
        launches[cat] += n
        used[rule] += n

    notes, idle = [], 0.0
    if gpu:
        kern = _device_kernels(events)
        left_n, left_us = defaultdict(int), defaultdict(float)   # device kernels not yet attributed
        for k in kern:
            left_n[k.name] += 1
            left_us[k.name] += k.time_range.end - k.time_range.start
        for e in cpu:   # torch links each kernel to the op that launched it (FunctionEvent.kernels)
            for k in e.kernels:
                got = attribute(e) if left_n.get(k.name, 0) > 0 else None
                if got:
                    add(got[0], k.name, float(k.duration), got[1])
                    left_n[k.name] -= 1
                    left_us[k.name] -= float(k.duration)
        for name, n in left_n.items():   # launched outside any family op: rule 3
            if n > 0:
                cat = category_of_kernel(name)
                add(cat, name, max(left_us[name], 0.0), "name" if cat != OTHER else "none", n)
        span, busy = _span_busy(kern)
        idle = max(span - busy, 0.0)
        if not kern:
            notes.append("the profiler recorded no device kernel for the call")
        elif sum(us.values()) > busy * 1.001:
            notes.append(f"kernels overlapped (several streams): kernel time exceeds busy time by "
                         f"{sum(us.values()) - busy:.1f} us; shares are of kernel + idle time")
        notes.append("idle is measured under the profiler, which adds to the host's launch overhead")
    else:
        inside, stack = [], list(root.cpu_children) if root is not None else []
        while stack:
            inside.append(stack.pop())
            stack.extend(inside[-1].cpu_children)
        for e in (inside if root is not None else cpu):
            if e.name.startswith(_RANGE):
                continue   # flyexplore's own ranges: their self time is Python, not an op
            got = attribute(e) or (OTHER, "none")
            add(got[0], e.name, float(e.self_cpu_time_total), got[1])
        span = float(root.cpu_time_total) if root is not None else sum(us.values())
        notes.append("CPU run: no device kernels; times are CPU-op self times (each profiler event's own "
                     "time, children excluded: ATen ops and ranges such as torch.compile's, whose self "
                     "time holds Inductor's C++ kernels), shares of their sum; no idle is measured")
    kernel_us = sum(us.values())
    total = kernel_us + idle
    rows = []
    for cat in categories():
        t = idle if cat == IDLE else us.get(cat, 0.0)
        if t <= 0 and not (gpu and cat == IDLE):
            continue
        heads: Counter = Counter()
        for n, v in names[cat].items():
            heads[_short(n)] += v
        rows.append({"category": cat, "us": t, "share": t / total if total > 0 else 0.0,
                     "kernels": len(names[cat]), "launches": launches[cat],
                     "top": tuple(f"{n} ({v:.1f})" for n, v in heads.most_common(3))})
    unit = "kernels" if gpu else "CPU ops"
    words = {"module": f"module ranges (forward hooks on {hooked} modules a family keeps)",
             "aten": "the launching ATen op (cpu_parent chain)" if gpu else "the ATen op or range above (cpu_parent chain)",
             "name": "the kernel name (cuBLAS, CUTLASS, Tensile, flash/cuDNN/AOTriton, Inductor conventions)",
             "none": f"no rule: {OTHER}"}
    attribution = tuple(f"{words[r]}: {used[r]} {unit}" for r in ("module", "aten", "name", "none") if used[r])
    return Breakdown(tuple(rows), kernel_us, float(span), float(idle), "cuda" if gpu else "cpu",
                     attribution, tuple(notes))


def _short(name: str, width: int = 60) -> str:
    """A kernel's head (no ``void``, template arguments or parameters), cut to ``width``."""
    head = kernel_head(name.replace("(anonymous namespace)", "anonymous")) or name
    return head if len(head) <= width else head[:width - 1] + "…"
