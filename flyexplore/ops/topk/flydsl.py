"""TopK's FlyDSL path: the eager override of ``aten::topk`` in torch 2.15.

Rules re-derived (not copied) from ``torch/_native/ops/topk/flydsl_impl.py::_eligible`` /
``_kernel_for`` and ``torch/_native/ops/topk/_common.py::last_dim_row_major_ok``; checked
against torch's own functions in ``tests/ops/test_explain_agreement.py``. Registered as
``TOPK.flydsl`` (:mod:`flyexplore.ops.topk.operator`).
"""
from __future__ import annotations

from flyexplore.ops.base import FlyDSLPath, KernelPattern
from flyexplore.world.conditions import UINT32_MAX, Condition, TensorDesc, cond, fits_native, opt_stride, short_dtype
from flyexplore.world.readiness import MI355X_CUS

_TOPK = "torch/_native/ops/topk/flydsl_impl.py"


#: TopK kernel bands on gfx950 (``flydsl_impl.py``): register K set and N range; radix
#: (K low, K high, N low, N high), all inclusive.
TOPK_REGISTER_KS = (2, 4, 8, 16)
TOPK_REGISTER_N = (1024, 8192)
TOPK_RADIX_BANDS = ((64, 256, 8192, 32768), (257, 383, 16384, 32768),
                    (384, 831, 32768, 131072), (832, 1024, 32768, 262144))


def topk_kernel(k: int, n: int) -> str | None:
    """Which FlyDSL TopK kernel (K, N) selects: ``"register"``,
    ``"radix K a-b, N c-d"`` or ``None`` (``flydsl_impl.py::_kernel_for``)."""
    if k in TOPK_REGISTER_KS and n > 0 and n & (n - 1) == 0 and TOPK_REGISTER_N[0] <= n <= TOPK_REGISTER_N[1]:
        return "register"
    for k0, k1, n0, n1 in TOPK_RADIX_BANDS:
        if k0 <= k <= k1:
            return f"radix K {k0}-{k1}, N {n0}-{n1}" if n0 <= n <= n1 else None
    return None


def topk_rules(x, k: int, dim: int = -1, largest: bool = True, sorted: bool = True,
               cu_count: int = MI355X_CUS, cu_source: str = "assumed MI355X") -> tuple[list[Condition], str | None]:
    """Call conditions of the FlyDSL TopK override (``_cond(self, k, dim, largest, sorted)``)
    and the kernel family it would pick."""
    x = TensorDesc.of(x)
    E = f"{_TOPK}::_eligible"
    k, dim = int(k), int(dim)
    out = [cond("device", x.device_type == "cuda" and x.device_index is not None,
              f"input on {x.device}" + ("" if x.device_type == "cuda" else ": needs a GPU tensor"), E),
           cond("dtype", short_dtype(x.dtype) == "fp32", f"dtype {short_dtype(x.dtype)}" + (" ok" if short_dtype(x.dtype) == "fp32"
              else ": the FlyDSL TopK kernels take fp32 only"), E),
           cond("largest", bool(largest), "largest=True" if largest else "largest=False: FlyDSL TopK selects the largest only", E),
           cond("sorted", bool(sorted), "sorted=True" if sorted else "sorted=False: FlyDSL TopK returns sorted values only", E)]
    nd = -1 if x.ndim == 0 or dim < -x.ndim or dim >= x.ndim else dim % x.ndim
    last = x.ndim > 0 and nd == x.ndim - 1
    out.append(cond("last dim", last, f"dim={dim} is the last dim" if last else
                  f"dim={dim} is not the last dim of a {x.ndim}-D input", "torch/_native/ops/topk/_common.py::last_dim_row_major_ok"))
    out.append(cond("contiguous", x.is_contiguous(), "input contiguous" if x.is_contiguous()
                  else f"input not contiguous (stride {x.stride})", "torch/_native/ops/topk/_common.py::last_dim_row_major_ok"))
    out.append(cond("non-empty", x.numel != 0, "input non-empty" if x.numel else "input is empty", E))
    kernel = None
    if x.ndim >= 1 and x.numel:
        n = x.shape[-1]
        m = x.numel // n
        fits = fits_native(m, n, x.itemsize) and m * k * 8 <= UINT32_MAX
        out.append(cond("buffer span", fits, f"input {m * n * x.itemsize} B and indices {m * k * 8} B"
                      + (" fit 32-bit buffer descriptors" if fits else ": exceed the 32-bit buffer span"),
                      f"{_TOPK}::_fits_topk_buffer_span"))
        rows = m >= cu_count
        out.append(cond("rows", rows, f"M={m} rows " + (">=" if rows else "<") + f" {cu_count} CUs ({cu_source})"
                      + ("" if rows else ": fewer rows than CUs leave the GPU idle, ATen is used"),
                      f"{_TOPK}::_min_rows_for_full_wave"))
        kernel = topk_kernel(k, n)
        if kernel:
            detail = f"K={k}, N={n}: {kernel} kernel"
        elif k in TOPK_REGISTER_KS:
            detail = (f"K={k}, N={n}: the register kernel needs N a power of two in "
                      f"{TOPK_REGISTER_N[0]}..{TOPK_REGISTER_N[1]}")
        else:
            band = next((b for b in TOPK_RADIX_BANDS if b[0] <= k <= b[1]), None)
            detail = (f"K={k}, N={n}: radix band K {band[0]}-{band[1]} needs N in {band[2]}..{band[3]}" if band
                      else f"K={k} has no FlyDSL kernel (register: K in {{2,4,8,16}}; radix: K 64..1024)")
        out.append(cond("kernel band", kernel is not None, detail, f"{_TOPK}::_kernel_for"))
    return out, kernel


def topk_bands():
    """TopK's FlyDSL kernel families on gfx950 and the (K, N) band each covers, as a
    ``pandas.DataFrame`` (columns ``kernel, k, n``; ``torch/_native/ops/topk/flydsl_impl.py``
    ``_kernel_for``). Rows outside every band run ATen."""
    import pandas as pd

    rows = [{"kernel": "register", "k": ", ".join(map(str, TOPK_REGISTER_KS)),
             "n": f"power of two in {TOPK_REGISTER_N[0]}..{TOPK_REGISTER_N[1]}"}]
    for k0, k1, n0, n1 in TOPK_RADIX_BANDS:
        rows.append({"kernel": f"radix K {k0}-{k1}, N {n0}-{n1}", "k": f"{k0}..{k1}", "n": f"{n0}..{n1}"})
    return pd.DataFrame(rows, columns=["kernel", "k", "n"])


def judge(call: dict, f, common: dict):
    """``judge`` for ``torch.topk(x, k, dim=-1, largest=True, sorted=True)`` (with the process's
    ``deterministic`` mode): pops ``x``, ``k``, ``dim``, ``largest``, ``sorted``,
    ``deterministic``; the row gate reads the CU count of ``f``."""
    x = TensorDesc.of(call.pop("x"))
    k = int(call.pop("k"))
    dim, largest, sorted_ = call.pop("dim", -1), call.pop("largest", True), call.pop("sorted", True)
    det = call.pop("deterministic", False)
    args = {"x": x.text(), "k": k, "dim": dim, "largest": largest, "sorted": sorted_, "deterministic": det}
    rules, kernel = topk_rules(x, k, dim, largest, sorted_, f.cu_count, f.cu_source)
    notes = []
    if kernel and kernel.startswith("radix"):
        notes.append("deterministic mode " + ("on: the radix kernel gathers in input order (matches ATen)"
                     if det else "off: radix indices on ties may vary between runs"))
    elif kernel == "register":
        notes.append("the register kernel is reproducible; deterministic mode does not change it")
    return args, rules, kernel, notes


def describe(case, dtype: str, opts: dict, device: str) -> dict:
    """The ``judge`` call for a catalogue case ``MxNxK[:deterministic=1,..]``; options
    ``x_stride``, ``dim``, ``cu`` (returned as ``_cu``: the CU count to judge with)."""
    p = case.p
    m, n, k = p["m"], p["n"], p["k"]
    x = TensorDesc((m, n), dtype, opt_stride(opts, "x_stride", None), 0, device)
    out = dict(x=x, k=k, dim=int(opts.pop("dim", -1)), largest=p["largest"], sorted=p["sorted"],
               deterministic=p["deterministic"])
    if "cu" in opts:
        out["_cu"] = int(opts.pop("cu"))
    return out


_KERNELS = "torch/_native/ops/topk/flydsl_kernels.py"
FLYDSL = FlyDSLPath(
    route="eager",
    path="eager override of aten::topk",
    judge=judge,
    describe=describe,
    options=("x_stride", "dim", "cu", "device"),
    example="4096x2048x8",
    kernels=(KernelPattern(r"^register_topk_kernel(_\d+)?$", f"FlyDSL TopK register ({_KERNELS})"),
             KernelPattern(r"^radix_select_topk_kernel(_\d+)?$", f"FlyDSL TopK radix ({_KERNELS})")),
    aten_ops=("topk", "topk.values"),
    module="torch._native.ops.topk.flydsl_impl",
    xray="flyexplore.ops.topk.xray:build",
    kernel_table=topk_bands,
)
