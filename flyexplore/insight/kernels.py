"""Kernel families: every device kernel name torch's profiler reports, put in a family --
FlyDSL, Triton/Inductor, vendor BLAS (hipBLASLt, rocBLAS, cuBLAS, cuBLASLt, CUTLASS), AOTriton
(with its backend: Triton, aiter or FlyDSL), CK, attention (flash, cuDNN, memory-efficient), ATen
native, runtime (memcpy/memset) -- or ``unclassified`` when no rule knows the name (never a
guess); and the top-level CPU operators of a CPU trace (:func:`classify_cpu_op`).

FlyDSL kernel names come from the operator registry: every family's ``FlyDSLPath.kernels``
(:class:`~flyexplore.ops.base.KernelPattern`), read at each classification, so a family added
with :func:`flyexplore.ops.register_op` is classified too.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from flyexplore.ops import get_op, list_ops
from flyexplore.ops.base import KernelPattern

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
