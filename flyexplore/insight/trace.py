"""What really ran: the kernels a call launched, each put in a family, and the autotune
decisions of torch.compile GEMMs.

:func:`trace` runs a callable under ``torch.profiler`` and returns a :class:`Trace`: every
device kernel the call launched (launches and device µs per call), classified by
:func:`classify` into a family -- FlyDSL, Triton/Inductor, vendor BLAS (hipBLASLt, rocBLAS,
cuBLAS, cuBLASLt, CUTLASS), AOTriton, CK, attention (flash, cuDNN, memory-efficient), ATen
native, runtime (memcpy/memset) -- or ``unclassified`` when no rule knows the name (never a
guess). On a CPU there are no device kernels: the trace lists the top-level CPU operators of
the call instead and says so.

:func:`capture_autotune` records each Inductor autotune decision (every candidate benchmarked,
its time, the winner; :mod:`flyexplore.insight.autotune`, re-exported here), so "FlyDSL enabled but
Triton won" is visible: :attr:`AutotuneDecision.winner_family`.

FlyDSL kernel names come from the operator registry: every family's
``FlyDSLPath.kernels`` (:class:`~flyexplore.ops.base.KernelPattern`), read at each
classification, so a family added with :func:`flyexplore.ops.register_op` is classified too.

Sweeps reuse the kernel list :class:`~flyexplore.measure.timing.Timer` already collects in ``kernel``
mode (:func:`from_kernels`) and profile one extra call only when it has none.
"""
from __future__ import annotations

import contextlib
import functools
import json
import re
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Sequence

from flyexplore.errors import UsageError
from flyexplore.insight.autotune import (  # noqa: F401  (re-exported)
    CHOICE_FAMILIES,
    AutotuneDecision,
    Candidate,
    _selector_cache,
    autotune_dict,
    capture_autotune,
    classify_choice,
    decision_from_timings,
    parse_autotune_tables,
)
from flyexplore.insight.explain import explain_case
from flyexplore.measure.devstate import default_device
from flyexplore.measure.timing import kernel_times_from_profile
from flyexplore.ops import get_op, list_ops
from flyexplore.ops.base import KernelPattern, RunContext, reset_dynamo, torch_dtype
from flyexplore.world import env as ENV
from flyexplore.world.switches import compile_options

#: Kernel families, in report order.
FAMILIES = ("FlyDSL", "Triton/Inductor", "vendor BLAS", "AOTriton", "CK", "attention", "ATen native",
            "runtime", "unclassified")

#: AOTriton's kernels by backend (the ``observed`` column shows ``AOTriton[<backend>]``) and by
#: pass, as AOTriton's own source names them:
#:
#: - Triton: the ``@ati.source`` kernels of ``modules/flash/aot/*.py`` (tag 0.13b and the 0.14
#:   development tree; the symbol is the Triton function's name). ``debug_fill_dropout_rng*``
#:   are the dropout-mask debug kernels of ``dropout_rng.py`` (``tritonsrc/`` up to 0.12b,
#:   ``modules/flash/kernel/`` at 0.13b).
#: - aiter: AITER's prebuilt fmha v3 assembly, symbols ``aiter::fmha_fwd_*`` / ``aiter::fmha_bwd_*``
#:   (mangled ``_ZN5aiter<n>fmha_...E``), listed in ``v3src/flash/aiter/asm_fmha_v3_{fwd,bwd}_configs.hpp``
#:   at 0.13b and ``modules/flash/csrc/aiter/`` later.
#: - FlyDSL ("flyc", first in 0.14): each FlyDSL kernel AOTriton compiles exports its description's
#:   name, not FlyDSL's ``<kernel def>_<id>`` (``python/flyc_compile.py::_expected_gpu_symbol``,
#:   ``ir/flyc/kdesc.py::gpu_symbol_name``): ``flyc_attn_fwd``, ``flyc_bwd_dkdv``, ``flyc_bwd_dq``
#:   (``modules/flash/aot/flyc_*.py``). The flyc backward is a metro: Triton ``bwd_preprocess``
#:   first, then the two FlyDSL kernels.
#:
#: The 0.14.2b tag itself is not in the fetched snapshot of ROCm/aotriton; the flyc facts come from
#: the 0.14 development files (see ``tests/insight/data/aotriton_kernel_names.json`` for every name and source).
AOTRITON_KERNELS: dict[tuple[str, str], tuple[str, ...]] = {
    ("Triton", "fwd"): ("attn_fwd", "debug_simulate_encoded_softmax"),
    ("Triton", "bwd"): ("bwd_preprocess", "bwd_preprocess_varlen", "bwd_kernel_dk_dv", "bwd_kernel_dq",
                        "bwd_kernel_fuse"),
    ("Triton", "dropout"): ("debug_fill_dropout_rng", "debug_fill_dropout_rng_tensor"),
    ("FlyDSL", "fwd"): ("flyc_attn_fwd",),
    ("FlyDSL", "bwd"): ("flyc_bwd_dkdv", "flyc_bwd_dq"),
}
#: AOTriton backends, in the order its operators number them (``op_attn_fwd``: triton 0, aiter 1, flyc 2).
AOTRITON_BACKENDS = ("Triton", "aiter", "FlyDSL")
_AOTRITON_LIB = {"Triton": "AOTriton Triton kernels", "aiter": "AOTriton aiter assembly (fmha v3)",
                 "FlyDSL": "AOTriton FlyDSL (flyc) kernels"}
_AOTRITON_RULES: tuple[tuple[str, re.Pattern, str], ...] = (
    *((be, re.compile(rf"^{name}$"), f"AOTriton {be} kernel name ({pas})")
      for (be, pas), names in AOTRITON_KERNELS.items() for name in names),
    ("aiter", re.compile(r"^(aiter::|_ZN5aiter\d+)fmha_(fwd|bwd)_\w+"), "aiter fmha v3 kernel symbol"),
)

# (family, library, pattern on the kernel's head, why) -- the head is the name without a
# leading "void " and without template arguments / parameter list. First match wins; the
# registry's FlyDSL patterns (_flydsl_rules) are tried before these, AOTriton's before both.
_RULES: tuple[tuple[str, str, re.Pattern, str], ...] = tuple(
    (fam, lib, re.compile(pat), why) for fam, lib, pat, why in (
        # attention libraries (CUDA): flash-attention 2 in ATen, cuDNN SDPA, memory-efficient (CUTLASS fmha).
        ("attention", "flash-attention (ATen pytorch_flash)", r"^pytorch_flash::", "pytorch_flash namespace"),
        ("attention", "flash-attention", r"^(flash_fwd|flash_bwd)\w*kernel", "flash_fwd/flash_bwd kernel"),
        ("attention", "cuDNN SDPA", r"^cudnn_generated_fort_native_sdpa", "cuDNN generated SDPA kernel"),
        ("attention", "memory-efficient attention (CUTLASS fmha)", r"^fmha_cutlass[FB]", "xformers-derived fmha"),
        ("attention", "cuDNN", r"^cudnn[_:]", "cuDNN kernel"),
        # CK (composable_kernel), incl. CK-tile FMHA used by SDPA when CK is preferred.
        ("CK", "CK tile", r"^ck_tile::", "ck_tile namespace"),
        ("CK", "CK", r"^ck::", "ck namespace"),
        ("CK", "CK", r"^_ZN(2ck|7ck_tile)", "mangled ck namespace"),
        # Triton: Inductor's generated kernels and templates; any triton_ prefix.
        ("Triton/Inductor", "Inductor-generated Triton", r"^triton_(poi|red|per|tem|for|mm|bmm|spl)_?",
         "Inductor kernel naming"),
        ("Triton/Inductor", "Triton", r"^triton_", "triton_ prefix"),
        # vendor BLAS.
        ("vendor BLAS", "hipBLASLt/rocBLAS (Tensile)", r"^Cijk_", "Tensile kernel naming"),
        ("vendor BLAS", "hipBLASLt", r"(?i)hipblaslt", "hipblaslt in name"),
        ("vendor BLAS", "rocBLAS", r"^rocblas_", "rocblas_ prefix"),
        ("vendor BLAS", "cuBLASLt", r"^cublasLt", "cublasLt namespace"),
        ("vendor BLAS", "cuBLAS (nvjet)", r"^nvjet_", "cuBLAS nvjet kernel"),
        ("vendor BLAS", "cuBLAS (xmma)", r"^(sm\d+_)?xmma_", "cuBLAS xmma kernel"),
        ("vendor BLAS", "cuBLAS", r"^(ampere|volta|turing|hopper|maxwell|sm\d+)_\w*(gemm|gemv)", "cuBLAS arch-prefixed GEMM"),
        ("vendor BLAS", "cuBLAS", r"^(gemv2[NT]_kernel|gemvx|gemmSN_|gemmk1_kernel|splitKreduce_kernel|gemm_kernel_splitk)",
         "cuBLAS helper kernel"),
        ("vendor BLAS", "CUTLASS", r"^cutlass(::|_)", "cutlass namespace/prefix"),
        # ATen's own CUDA/HIP kernels (and the CUB/Thrust they instantiate).
        ("ATen native", "ATen", r"^at::", "at:: namespace"),
        ("ATen native", "ATen (CUB)", r"^at_cuda_detail::", "CUB as vendored by ATen"),
        ("ATen native", "ATen", r"^c10::", "c10 namespace"),
        # runtime memory operations as the CUDA profiler names them.
        ("runtime", "memset/memcpy", r"^(Memset|Memcpy)( |$)", "CUDA runtime memory operation"),
    ))


def flydsl_kernel_patterns() -> tuple[KernelPattern, ...]:
    """Every registered family's FlyDSL kernel names (``op.flydsl.kernels``, in
    :func:`flyexplore.ops.list_ops` order): what :func:`classify` calls family ``FlyDSL``.
    Built-in families name torch 2.15's ``@flyc.kernel`` functions, which flyc compiles as
    ``<python function>_<id>`` (``flydsl/compiler/kernel_function.py``)."""

    return tuple(k for n in list_ops() if (p := get_op(n).flydsl) is not None for k in p.kernels)


def _flydsl_rules() -> tuple[tuple[str, str, re.Pattern, str], ...]:
    return _compile_flydsl(flydsl_kernel_patterns())


@functools.lru_cache(maxsize=8)
def _compile_flydsl(patterns: tuple[KernelPattern, ...]) -> tuple[tuple[str, str, re.Pattern, str], ...]:
    # keyed on the registry's patterns themselves: registering or removing a family changes the key
    return tuple(("FlyDSL", k.library, re.compile(k.regex), k.why) for k in patterns)


@dataclass(frozen=True)
class KernelClass:
    """A kernel's family, the library inside it, and the rule that matched (empty when
    ``unclassified``). ``backend``: for family AOTriton, which of its backends the kernel
    belongs to (``Triton``, ``aiter`` or ``FlyDSL``); empty otherwise."""

    family: str
    library: str
    rule: str = ""
    backend: str = ""

    @property
    def label(self) -> str:
        """The family as the ``observed`` column writes it: ``AOTriton[FlyDSL]`` for an AOTriton
        kernel (its backend in brackets), else the family."""
        return f"{self.family}[{self.backend}]" if self.backend else self.family


def kernel_head(name: str) -> str:
    """``"void at::native::foo<float>(int)"`` -> ``"at::native::foo"``: the name without a
    leading return type ``void`` and without template arguments or parameters."""
    s = name.strip()
    if s.startswith("void "):
        s = s[5:].lstrip()
    cut = len(s)
    for ch in "<(":
        i = s.find(ch)
        if i != -1:
            cut = min(cut, i)
    return s[:cut].strip()


def classify(name: str) -> KernelClass:
    """The :class:`KernelClass` of one device kernel name (as ``torch.profiler`` reports it),
    or family ``"unclassified"`` when no rule matches. Rules are name patterns with a stated
    reason (FlyDSL: the registered families' :class:`~flyexplore.ops.base.KernelPattern`,
    :func:`flydsl_kernel_patterns`; AOTriton: its Triton kernel names; cuBLAS: ``nvjet_`` /
    ``xmma`` / arch-prefixed names; Tensile ``Cijk_`` names are hipBLASLt or rocBLAS, which
    their names do not tell apart). AOTriton kernels get their backend
    (:data:`AOTRITON_KERNELS`): ``attn_fwd`` -> AOTriton / Triton, ``flyc_attn_fwd`` ->
    AOTriton / FlyDSL, ``aiter::fmha_fwd_hd128_bf16`` -> AOTriton / aiter."""
    head = kernel_head(name)
    for be, pat, why in _AOTRITON_RULES:
        if pat.search(head):
            return KernelClass("AOTriton", _AOTRITON_LIB[be], why, be)
    for fam, lib, pat, why in _flydsl_rules() + _RULES:
        if pat.search(head):
            return KernelClass(fam, lib, why)
    return KernelClass("unclassified", "", "")


#: CPU-side profiler events that are framework work, not the operator.
_CPU_RUNTIME = re.compile(r"^(TorchDynamo Cache Lookup|Pregraph bytecode|AOTDispatcher|"
                          r"AOTDispatcher Runtime Wrapper|cudaDeviceSynchronize|hipDeviceSynchronize)")


def classify_cpu_op(name: str) -> KernelClass:
    """Family of a top-level CPU profiler event: ``aten::*`` -> ATen native (CPU op);
    ``Torch-Compiled Region`` / ``CompiledFxGraph`` -> Triton/Inductor (Inductor's compiled
    graph: C++ on CPU); Dynamo/AOT wrappers -> runtime; else unclassified."""
    if name.startswith("aten::"):
        return KernelClass("ATen native", "ATen CPU op", "aten:: operator")
    if name.startswith("Torch-Compiled Region") or "CompiledFxGraph" in name:
        return KernelClass("Triton/Inductor", "Inductor compiled graph", "torch.compile region")
    if _CPU_RUNTIME.search(name):
        return KernelClass("runtime", "torch.compile wrapper", "Dynamo/AOTAutograd wrapper")
    return KernelClass("unclassified", "", "")


@dataclass(frozen=True)
class TracedKernel:
    """One kernel (``where="device"``) or top-level CPU operator (``where="cpu"``): launches
    per call and time per call in µs (device time for kernels, CPU time for CPU ops)."""

    name: str
    family: str
    library: str
    calls: float
    us: float
    where: str = "device"
    backend: str = ""

    @property
    def label(self) -> str:
        """``AOTriton[<backend>]`` for an AOTriton kernel, else the family (see :class:`KernelClass`)."""
        return f"{self.family}[{self.backend}]" if self.backend else self.family


# -- traces --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Trace:
    """What one call ran. ``kernels``: device kernels (empty on CPU); ``cpu_ops``: top-level
    CPU operators (filled when there are no device kernels); ``autotune``: the decisions
    captured while the call was first run (compiled); ``device``: ``"cuda"`` or ``"cpu"``."""

    kernels: tuple[TracedKernel, ...]
    cpu_ops: tuple[TracedKernel, ...] = ()
    autotune: tuple[AutotuneDecision, ...] = ()
    device: str = "cuda"
    notes: tuple[str, ...] = ()

    @property
    def items(self) -> tuple[TracedKernel, ...]:
        return self.kernels if self.kernels else self.cpu_ops

    @property
    def families(self) -> tuple[str, ...]:
        """Families seen, by time spent (device kernels if any, else CPU ops)."""
        tot: dict[str, float] = {}
        for k in self.items:
            tot[k.family] = tot.get(k.family, 0.0) + k.us
        return tuple(sorted(tot, key=lambda f: -tot[f]))

    @property
    def observed(self) -> str:
        """Comma-separated families by time (the ``observed`` result column), AOTriton split by
        backend (``AOTriton[FlyDSL],AOTriton[Triton]``); CPU traces say so."""
        if not self.items:
            return "no kernels recorded"
        tot: dict[str, float] = {}
        for k in self.items:
            tot[k.label] = tot.get(k.label, 0.0) + k.us
        fams = ",".join(sorted(tot, key=lambda f: -tot[f]))
        return fams if self.kernels else f"CPU: {fams}"

    @property
    def aotriton_backends(self) -> tuple[str, ...]:
        """AOTriton's backends whose kernels ran (``Triton``, ``aiter``, ``FlyDSL``), by time."""
        tot: dict[str, float] = {}
        for k in self.kernels:
            if k.family == "AOTriton" and k.backend:
                tot[k.backend] = tot.get(k.backend, 0.0) + k.us
        return tuple(sorted(tot, key=lambda b: -tot[b]))

    @property
    def flydsl_taken(self) -> bool | None:
        """True when a FlyDSL kernel ran (AOTriton's FlyDSL "flyc" kernels included); False when
        every device kernel seen is classified and none is FlyDSL, or the call ran on the CPU
        (FlyDSL is GPU-only); None (unknown) when a GPU call left no kernel record or some kernel
        is unclassified."""
        if self.kernels:
            if any(k.family == "FlyDSL" or k.backend == "FlyDSL" for k in self.kernels):
                return True
            return None if any(k.family == "unclassified" for k in self.kernels) else False
        return False if self.device == "cpu" else None

    @property
    def unclassified(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.items if k.family == "unclassified")

    def to_frame(self):
        """One row per kernel / CPU op: name, family, library, calls, us, where."""
        import pandas as pd

        return pd.DataFrame([asdict(k) for k in self.items],
                            columns=["name", "family", "library", "calls", "us", "where"])

    def family_frame(self):
        """One row per family, by time: ``family``, ``kernels`` (distinct names), ``calls``
        (launches per call), ``us`` (µs per call) and ``share`` (of the traced time, 0..1).
        Device kernels if any, else the CPU operators (``where`` says which)."""
        import pandas as pd

        cols = ["family", "kernels", "calls", "us", "share", "where"]
        items = self.items
        if not items:
            return pd.DataFrame(columns=cols)
        total = sum(k.us for k in items)
        rows = []
        for fam in self.families:
            ks = [k for k in items if k.family == fam]
            us = sum(k.us for k in ks)
            rows.append({"family": fam, "kernels": len({k.name for k in ks}), "calls": sum(k.calls for k in ks),
                         "us": us, "share": us / total if total > 0 else float("nan"), "where": ks[0].where})
        return pd.DataFrame(rows, columns=cols)

    def autotune_frame(self):
        """Every autotune candidate seen: ``op``, ``name``, ``family``, ``time_ms`` (``inf``: it
        failed), ``winner`` (bool), ``source`` (``feedback_saver`` or ``stderr``); fastest first
        within each decision."""
        import pandas as pd

        rows = []
        for d in self.autotune:
            w = d.winner
            for c in d.candidates:
                rows.append({"op": d.op, "name": c.name, "family": c.family, "time_ms": c.time_ms,
                             "winner": w is not None and c.name == w.name, "source": d.source})
        return pd.DataFrame(rows, columns=["op", "name", "family", "time_ms", "winner", "source"])

    def to_dict(self) -> dict:
        return {"device": self.device, "observed": self.observed, "flydsl_taken": self.flydsl_taken,
                "kernels": [asdict(k) for k in self.kernels], "cpu_ops": [asdict(k) for k in self.cpu_ops],
                "autotune": [autotune_dict(d) for d in self.autotune], "notes": list(self.notes)}

    def to_text(self) -> str:
        lines = [f"observed: {self.observed}"]
        if not self.kernels:
            lines.append("no device kernels" + (" (CPU run: top-level CPU operators below)" if self.device == "cpu" else ""))
        for k in self.items:
            lines.append(f"  {k.us:10.2f} us  x{k.calls:g}  {k.family:16s} {k.library:34s} {k.name[:110]}")
        for d in self.autotune:
            lines.append("autotune " + d.summary())
        for n in self.notes:
            lines.append(f"note: {n}")
        return "\n".join(lines)


def from_kernels(kernels: Iterable, autotune: Sequence[AutotuneDecision] = (), device: str = "cuda") -> Trace:
    """A :class:`Trace` from :class:`~flyexplore.measure.timing.KernelTime` objects or the
    ``kernels`` JSON column (``[[name, launches per call, us per call], ...]``)."""
    if isinstance(kernels, str):
        kernels = json.loads(kernels) if kernels.strip() else []
    out = []
    for k in kernels:
        name, calls, us = (k.name, k.calls_per_iter, k.us_per_iter) if hasattr(k, "name") else (k[0], k[1], k[2])
        c = classify(name)
        out.append(TracedKernel(name, c.family, c.library, float(calls), float(us), backend=c.backend))
    return Trace(tuple(out), (), tuple(autotune), device)


_LABEL = "flyexplore::trace"


def _cpu_ops(prof, reps: int, label: str) -> tuple[TracedKernel, ...]:
    agg: dict[str, list[float]] = {}
    for evt in prof.events():
        if evt.name != label:
            continue
        for child in evt.cpu_children:
            agg.setdefault(child.name, []).append(float(child.cpu_time_total))
    out = []
    for name, ts in sorted(agg.items(), key=lambda kv: -sum(kv[1])):
        c = classify_cpu_op(name)
        out.append(TracedKernel(name, c.family, c.library, len(ts) / reps, sum(ts) / reps, "cpu"))
    return tuple(out)


def trace(fn: Callable[[], Any], *, device=None, reps: int = 3, warmup: int = 1,
          autotune: bool = True) -> Trace:
    """Run ``fn`` ``warmup`` times (the first call compiles and autotunes a compiled
    callable; decisions are captured when ``autotune``), then ``reps`` times under
    ``torch.profiler``, and classify what ran. ``device``: where ``fn`` runs (default: the
    current CUDA/ROCm device if there is one, else the CPU). Times are per call (µs)."""
    import torch
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile


    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gpu = dev.type == "cuda"
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    cap = capture_autotune() if autotune else contextlib.nullcontext([])
    with cap as decisions:
        for _ in range(warmup):
            fn()
        if gpu:
            torch.cuda.synchronize(dev)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with profile(activities=acts) as prof:
        for _ in range(reps):
            with record_function(_LABEL):
                fn()
        if gpu:
            torch.cuda.synchronize(dev)
    notes = []
    kernels: tuple[TracedKernel, ...] = ()
    if gpu:
        _, kts = kernel_times_from_profile(prof, reps, _LABEL)
        kernels = from_kernels(kts).kernels
        if not kernels:
            notes.append("the profiler recorded no device kernel for the call")
    cpu = () if kernels else _cpu_ops(prof, reps, _LABEL)
    if not gpu:
        notes.append("CPU run: no device kernels exist; listed are the call's top-level CPU operators")
    if autotune and not decisions:
        notes.append("no autotune decision captured (eager call, a single candidate, compiled before tracing, "
                     "or a graph served from Inductor's FX graph cache: set "
                     "fx_graph_cache=False and autotune_local_cache=False to see the decision)")
    return Trace(kernels, cpu, tuple(decisions), "cuda" if gpu else "cpu", tuple(notes))


# -- sweep rows ----------------------------------------------------------------------------

def flydsl_compile_options(op: str) -> dict:
    """The ``torch.compile`` options the catalogue's ``flydsl`` backend of ``op`` uses: the
    ``FLYDSL_OPTIONS`` of the module defining that backend (found through the registry,
    :func:`flyexplore.ops.get_op`) if it has one, else
    :func:`flyexplore.world.switches.compile_options`."""
    import sys


    try:
        bk = get_op(op).backends.get("flydsl")
    except UsageError:
        bk = None
    mod = sys.modules.get(getattr(bk.build, "__module__", "")) if bk is not None else None
    opts = getattr(mod, "FLYDSL_OPTIONS", None)
    if isinstance(opts, dict):
        return dict(opts)
    return compile_options(True)


def _path(op: str):
    """The registered :class:`~flyexplore.ops.base.FlyDSLPath` of ``op``, or None for an
    operator without one or outside the catalogue."""

    try:
        return get_op(op).flydsl
    except UsageError:
        return None


def row_columns(tr: Trace, backend: str, op: str, case, dtype: str,
                compile_options: dict | None = None) -> dict:
    """The result columns a traced sweep row gets: ``observed``, ``autotune`` (JSON) and, for
    a ``flydsl`` request, ``flydsl_taken`` and ``flydsl_reason`` (what ran, and on a miss the
    explainer's reason or the autotune decision that picked another backend). A family whose
    FlyDSL path reads its own rows (``op.flydsl.trace_columns``; attention, whatever SDPA
    backend the row asked for: AOTriton's FlyDSL ("flyc") kernels count as FlyDSL taken,
    :func:`flyexplore.ops.attention.aotriton.row_columns`) fills these columns itself."""
    cols: dict[str, Any] = {"observed": tr.observed}
    if tr.autotune:
        cols["autotune"] = json.dumps([autotune_dict(d) for d in tr.autotune])
    path = _path(op)
    if path is not None and path.trace_columns is not None:  # e.g. attention: what AOTriton ran
        cols.update(path.trace_columns(tr, case, dtype))
        return cols
    if backend != "flydsl":
        return cols
    taken = tr.flydsl_taken
    cols["flydsl_taken"] = taken
    if taken:
        names = sorted({k.name for k in tr.kernels if k.family == "FlyDSL"})
        cols["flydsl_reason"] = "taken: FlyDSL kernels " + ", ".join(names)[:300]
        return cols
    if taken is None:
        won = [d for d in tr.autotune if d.winner_family == "FlyDSL"]
        if not tr.kernels:
            why = "the profiler recorded no device kernel for the call"
        else:
            why = ("no kernel named like a FlyDSL kernel, but some kernels are unclassified: "
                   + ", ".join(tr.unclassified)[:400])
        if won:
            why += "; the autotune picked FlyDSL (" + "; ".join(d.summary() for d in won) + ")"
        cols["flydsl_reason"] = "unknown: " + why
        return cols
    reason = None
    if compile_options is None:
        compile_options = flydsl_compile_options(op)
    lost = [d for d in tr.autotune if d.best_of("FlyDSL") is not None and d.winner_family != "FlyDSL"]
    if lost:
        reason = "not taken: FlyDSL was a candidate but lost the autotune -- " + "; ".join(d.summary() for d in lost)
    else:
        try:
            ex = explain_case(op, case, dtype, compile_options=compile_options)
        except Exception as exc:  # the explainer must never break a sweep
            ex = None
            reason = f"not taken (explainer failed: {type(exc).__name__}: {exc})"
        if ex is not None:
            reason = (ex.reason if not ex.taken else
                      "not taken although the explainer finds the call eligible; no autotune decision was "
                      "captured (a graph from Inductor's FX graph cache is not autotuned again), and for a "
                      "compiled GEMM another backend winning the autotune is the usual cause (observed: "
                      + tr.observed + ")")
        elif reason is None:
            reason = f"not taken (observed: {tr.observed}; no explainer for {op})"
    cols["flydsl_reason"] = reason[:1000]
    return cols


def trace_case(op: str, shape: str, backend: str, dtype: str | None = None, device=None,
               reps: int = 3, seed: int = 0) -> dict:
    """Trace one catalogue case (what ``flyexplore trace`` runs): build the inputs, enter the
    backend's context, run it under :func:`trace`. Returns a dict with ``status`` (``ok`` or
    ``unavailable``), ``message``, ``trace`` (a :class:`Trace` or ``None``) and, for the
    ``flydsl`` backend, ``flydsl_taken`` / ``flydsl_reason``. Raises
    :class:`~flyexplore.errors.UsageError` for an unknown operator, backend, dtype or a bad
    shape."""
    import torch


    o = get_op(op)
    case = o.case(shape)
    dt = o.check_dtype(dtype or o.dtypes[0])
    bk = o.get_backend(backend)
    dev = torch.device(device) if device is not None else default_device()
    ctx = RunContext(dev, ENV.collect())
    out: dict[str, Any] = {"op": op, "case": case.label, "dtype": dt, "backend": backend, "device": str(dev)}
    why = bk.available(ctx, case, dt)
    if why:
        return {**out, "status": "unavailable", "message": why, "trace": None}
    reset_dynamo()
    with bk.context(ctx, case):
        inputs = o.make_inputs(case, dt, dev, seed)
        fn = bk.build(case, dt, inputs, ctx)
        tr = trace(fn, device=dev, reps=reps, warmup=1)
    out.update(status="ok", message=None, trace=tr)
    if backend == "flydsl":
        cols = row_columns(tr, backend, op, case, dt)
        out.update(flydsl_taken=cols.get("flydsl_taken"), flydsl_reason=cols.get("flydsl_reason"))
    return out


def backend_status(op: str, shape: str, dtype: str | None = None, device=None) -> dict[str, str | None]:
    """Which of ``op``'s catalogue backends can run ``shape`` in ``dtype`` on ``device``
    (default: the first GPU, else the CPU): backend name -> ``None`` (can run) or the reason it
    cannot (what :func:`trace_case` would report as ``unavailable``). Raises
    :class:`~flyexplore.errors.UsageError` for an unknown operator, dtype or a bad shape."""
    import torch


    o = get_op(op)
    case = o.case(shape)
    dt = o.check_dtype(dtype or o.dtypes[0])
    ctx = RunContext(torch.device(device) if device is not None else default_device(), ENV.collect())
    return {name: b.available(ctx, case, dt) for name, b in o.backends.items()}


#: Default autotune case per device type: (shape MxNxK, dtype).
AUTOTUNE_CASES = {"cpu": ("32x16x48", "fp32"), "cuda": ("4096x4096x4096", "bf16")}


def trace_autotune(shape: str | None = None, dtype: str | None = None, device=None,
                   backends: str | None = None, reps: int = 3) -> Trace:
    """Compile one GEMM with max-autotune (Inductor's FX graph and autotune caches off, so the
    autotune really runs), trace it and return the :class:`Trace`: the autotune decision (every
    candidate, its time, the winner: :meth:`Trace.autotune_frame`) and what then ran.

    On a GPU: ``torch.mm`` of A [M, K] and B [K, N] (``shape`` ``MxNxK``, default 4096^3 bf16),
    ``max_autotune_gemm_backends`` = ``backends`` or ``ATEN,TRITON``, plus ``FLYDSL`` where
    :func:`flyexplore.world.env.collect` finds the FlyDSL compile templates ready (ROCm torch 2.15 on
    gfx950), so "FlyDSL enabled but Triton won" shows. On a CPU: ``torch.bmm`` over a batch of 2
    (default 32x16x48 fp32) with ``ATEN,CPP``: Inductor's CPU max-autotune benchmarks ATen
    against its C++ GEMM template for it (the case ``tests/insight/test_trace.py`` uses; a plain CPU mm
    was not autotuned in torch 2.15). The options used are valid in torch 2.11 and 2.15.
    Compiling takes seconds on a CPU and tens of seconds on a GPU (Triton autotuning).
    Raises :class:`~flyexplore.errors.UsageError` for a malformed shape or unknown dtype."""
    import torch


    dev = torch.device(device) if device is not None else default_device()
    kind = "cuda" if dev.type == "cuda" else "cpu"
    d_shape, d_dtype = AUTOTUNE_CASES[kind]
    p = get_op("gemm").case(shape or d_shape).p
    dt = torch_dtype(dtype or d_dtype)
    if backends is None:
        backends = "ATEN,CPP" if kind == "cpu" else "ATEN,TRITON"
        if kind == "cuda" and ENV.collect().flydsl_compile.ready:
            backends += ",FLYDSL"
    opts = {"max_autotune": True, "max_autotune_gemm_backends": backends, "fx_graph_cache": False,
            "autotune_local_cache": False}
    if kind == "cuda":
        opts["triton.cudagraphs"] = False
    m, n, k = p["m"], p["n"], p["k"]
    g = torch.Generator(device="cpu").manual_seed(0)
    torch._dynamo.reset()
    if kind == "cpu":
        a = torch.randn(2, m, k, generator=g, dtype=torch.float32).to(dt)
        b = torch.randn(2, k, n, generator=g, dtype=torch.float32).to(dt)
        f = torch.compile(torch.bmm, dynamic=False, options=opts)
    else:
        a = torch.randn(m, k, generator=g, dtype=torch.float32).to(dev, dt)
        b = torch.randn(k, n, generator=g, dtype=torch.float32).to(dev, dt)
        f = torch.compile(torch.mm, dynamic=False, options=opts)
    tr = trace(lambda: f(a, b), device=dev, reps=reps, warmup=1)
    what = (f"torch.{'bmm' if kind == 'cpu' else 'mm'} {'2x' if kind == 'cpu' else ''}{m}x{k} @ "
            f"{'2x' if kind == 'cpu' else ''}{k}x{n} {dtype or d_dtype}, max-autotune over {backends}")
    return Trace(tr.kernels, tr.cpu_ops, tr.autotune, tr.device, (what,) + tr.notes)


def result_text(r: dict) -> str:
    """A :func:`trace_case` result as text (what ``flyexplore trace`` prints): the case, the
    status and, when it ran, the :meth:`Trace.to_text` and the FlyDSL verdict."""
    lines = [f"{r['op']} {r['case']} {r['dtype']} backend {r['backend']} on {r['device']}: {r['status']}"]
    if r.get("message"):
        lines.append(str(r["message"]))
    if r.get("trace") is not None:
        lines.append(r["trace"].to_text())
    if r.get("flydsl_reason"):
        lines.append(f"FlyDSL: {r['flydsl_reason']}")
    return "\n".join(lines)
