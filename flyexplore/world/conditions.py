"""The vocabulary of the FlyDSL eligibility rules: tensor descriptions, conditions, verdicts.

:class:`TensorDesc` is what a rule reads from a tensor (shape, dtype, strides, storage offset,
device); :class:`Condition` is one rule evaluated and phrased with the torch 2.15 module and
function it comes from; :class:`Explanation` is the verdict for one call. The rules themselves
live with their operator family (``flyexplore/ops/<family>_flydsl.py``), the environment's
conditions in :mod:`flyexplore.world.readiness`, the front door in :mod:`flyexplore.insight.explain`.

Also here: the limits and helpers several families share (int32 buffer spans, Inductor's
input alignment, the autotuning mode) and the one parser of integer lists and booleans that
option texts use.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from flyexplore.errors import UsageError, bad_choice
from flyexplore.parsing import DTYPE_NAMES, parse_ints

INT32_MAX = (1 << 31) - 1
UINT32_MAX = (1 << 32) - 1
#: Byte alignment Inductor requires of GPU buffer origins (``torch/_inductor/utils.py::GPU_ALIGN_BYTES``).
GPU_ALIGN_BYTES = 16

#: Where the Inductor rules come from (torch 2.15.0 wheel paths).
SRC_MM = "torch/_inductor/kernel/mm.py"
SRC_GMM = "torch/_inductor/kernel/mm_grouped.py"
SRC_HEUR = "torch/_inductor/heuristics/template/flydsl.py"
SRC_VALID = "torch/_inductor/kernel/vendored_templates/flydsl/kernels/gemm_gfx950.py::make_gemm_param_and_validate"
SRC_GATE = "torch/_inductor/utils.py::use_flydsl_gemm_template"
SRC_NATIVE = "torch/_native/flydsl_utils.py"
SRC_ALIGN = ("torch/_inductor/graph.py (unaligned_buffers, from "
          "torch/_inductor/utils.py::should_assume_input_aligned) + torch/_inductor/ir.py::is_unaligned")
SRC_SPAN_IND = "torch/_inductor/kernel/mm_common.py::_fits_int32_buffer_span"


# -- descriptions of tensors ----------------------------------------------------------------

def as_dtype(d):
    """``torch.dtype`` of ``d`` (a dtype or a catalogue name such as ``"bf16"``); :class:`UsageError` naming an unknown name."""
    import torch

    if isinstance(d, torch.dtype):
        return d
    name = DTYPE_NAMES.get(str(d), str(d))
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise bad_choice("dtype", d, list(DTYPE_NAMES))
    return dt


def short_dtype(dtype) -> str:
    """The catalogue's short name of a torch dtype (``torch.bfloat16`` -> ``"bf16"``)."""
    names = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64",
             "float8_e4m3fn": "fp8_e4m3", "float4_e2m1fn_x2": "fp4_e2m1_x2",
             "float8_e8m0fnu": "e8m0", "int32": "int32", "int64": "int64"}
    s = str(dtype).replace("torch.", "")
    return names.get(s, s)


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides of ``shape`` (as ``torch.empty(shape).stride()``)."""
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(out))


@dataclass(frozen=True)
class TensorDesc:
    """What the rules read from a tensor: ``shape``, ``dtype`` (``torch.dtype``), ``stride``
    (elements; row-major when not given), ``storage_offset`` (elements) and ``device``
    (``"cuda"`` means ``"cuda:0"``, as a real tensor always has an index)."""

    shape: tuple[int, ...]
    dtype: Any
    stride: tuple[int, ...] | None = None
    storage_offset: int = 0
    device: str = "cuda:0"

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "dtype", as_dtype(self.dtype))
        st = contiguous_strides(self.shape) if self.stride is None else tuple(int(s) for s in self.stride)
        if len(st) != len(self.shape):
            raise UsageError(f"stride {st} does not match shape {self.shape} (need {len(self.shape)} values)")
        object.__setattr__(self, "stride", st)
        dev = str(self.device)
        if dev == "cuda":
            dev = "cuda:0"
        object.__setattr__(self, "device", dev)

    @classmethod
    def of(cls, t) -> "TensorDesc":
        """Describe a tensor (real, fake or meta) without reading its data."""
        if isinstance(t, TensorDesc):
            return t
        dev = t.device
        return cls(tuple(t.shape), t.dtype, tuple(t.stride()), int(t.storage_offset()),
                   f"{dev.type}:{dev.index}" if dev.index is not None else dev.type)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return int(self.dtype.itemsize)

    @property
    def device_type(self) -> str:
        return self.device.split(":")[0]

    @property
    def device_index(self) -> int | None:
        parts = self.device.split(":")
        return int(parts[1]) if len(parts) > 1 else None

    def is_contiguous(self) -> bool:
        """``torch.Tensor.is_contiguous()``: empty tensors are contiguous and size-1 dims'
        strides do not count."""
        if self.numel == 0:
            return True
        expected = 1
        for size, st in zip(reversed(self.shape), reversed(self.stride)):
            if size != 1:
                if st != expected:
                    return False
                expected *= size
        return True

    def text(self) -> str:
        s = f"{short_dtype(self.dtype)}[{', '.join(map(str, self.shape))}]"
        if self.stride != contiguous_strides(self.shape):
            s += f" stride ({', '.join(map(str, self.stride))})"
        if self.storage_offset:
            s += f" offset {self.storage_offset}"
        return s


def desc_or_none(t) -> TensorDesc | None:
    """``TensorDesc.of(t)``, or ``None`` for ``None`` (an optional tensor argument)."""
    return None if t is None else TensorDesc.of(t)


# -- conditions and explanations -------------------------------------------------------------

@dataclass(frozen=True)
class Condition:
    """One rule, evaluated. ``ok`` is ``None`` when it could not be evaluated because an
    earlier rule failed (for example strides of a tensor with the wrong rank). ``kind`` is
    ``"environment"``, ``"switch"``, ``"call"`` (the arguments) or ``"config"`` (whether a
    FlyDSL kernel configuration fits the shape)."""

    name: str
    ok: bool | None
    detail: str
    source: str
    kind: str = "call"


@dataclass(frozen=True)
class Explanation:
    """The answer for one call. ``taken``: FlyDSL would run (every condition holds);
    ``call_ok``: the arguments qualify (call and config conditions), whatever the
    environment; ``kernel``: which FlyDSL kernel family would run (TopK: register or a radix
    band; GEMMs: the template)."""

    op: str
    path: str
    arguments: dict
    conditions: tuple[Condition, ...]
    kernel: str | None = None
    notes: tuple[str, ...] = ()
    assumed: str | None = None

    @property
    def taken(self) -> bool:
        return all(c.ok is True for c in self.conditions)

    @property
    def call_ok(self) -> bool:
        return all(c.ok is True for c in self.conditions if c.kind in ("call", "config"))

    @property
    def environment_ok(self) -> bool:
        return all(c.ok is True for c in self.conditions if c.kind in ("environment", "switch"))

    @property
    def failed(self) -> tuple[Condition, ...]:
        return tuple(c for c in self.conditions if c.ok is False)

    @property
    def reason(self) -> str:
        """One line: ``"FlyDSL taken (<kernel>)"`` or ``"not taken: <failed conditions>"``."""
        if self.taken:
            return f"FlyDSL taken ({self.kernel})" if self.kernel else "FlyDSL taken"
        return "not taken: " + "; ".join(c.detail for c in self.failed)

    def to_dict(self) -> dict:
        return {"op": self.op, "path": self.path, "taken": self.taken, "call_ok": self.call_ok,
                "environment_ok": self.environment_ok, "kernel": self.kernel,
                "reason": self.reason, "assumed": self.assumed, "arguments": self.arguments,
                "conditions": [asdict(c) for c in self.conditions], "notes": list(self.notes)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def to_text(self) -> str:
        verdict = "YES" if self.taken else "NO"
        lines = [f"{self.op}: FlyDSL {verdict} -- {self.path}"]
        if self.assumed:
            lines.append(f"assumed: {self.assumed}")
        lines.append("arguments: " + ", ".join(f"{k}={v}" for k, v in self.arguments.items()))
        if self.kernel:
            lines.append(f"kernel: {self.kernel}" if self.taken else
                         f"kernel if the environment allowed: {self.kernel}")
        if not self.taken:
            lines.append(f"the call itself {'qualifies' if self.call_ok else 'does not qualify'}; "
                         f"the environment {'qualifies' if self.environment_ok else 'does not qualify'}")
        for kind in ("environment", "switch", "call", "config"):
            cs = [c for c in self.conditions if c.kind == kind]
            if not cs:
                continue
            lines.append(f"{kind}:")
            for c in cs:
                mark = {True: "ok ", False: "NO ", None: " - "}[c.ok]
                lines.append(f"  [{mark}] {c.detail}")
                lines.append(f"         ({c.source})")
        for n in self.notes:
            lines.append(f"note: {n}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()


def cond(name, ok, detail, source, kind="call") -> Condition:
    """One evaluated rule: ``name``, ``ok`` (True/False, ``None`` = not evaluated), ``detail`` in words, the torch ``source`` it comes from (``"torch/<file>.py::<function>"``) and its ``kind`` (``call``, ``config``, ``environment``, ``switch``)."""
    return Condition(name, None if ok is None else bool(ok), detail, source, kind)



# -- shared rule helpers ------------------------------------------------------------------

def fits_native(rows: int, n: int, itemsize: int) -> bool:
    """torch's eager int32 buffer-span rule: ``rows`` x ``n`` elements of ``itemsize`` bytes fit 32-bit offsets (``torch/_native/flydsl_utils.py::_fits_int32_buffer_span``)."""
    return 0 < rows <= INT32_MAX and 0 < n <= INT32_MAX and rows * n * itemsize <= UINT32_MAX


def fits_inductor(rows: int, stride: int | None, cols: int, itemsize: int) -> bool:
    """Inductor's span rule for a strided operand: ``((rows - 1) * stride + cols) * itemsize`` bytes within 32 bits and every extent within int32 (``torch/_inductor/kernel/mm_common.py::_fits_int32_buffer_span``)."""
    return (0 < rows <= INT32_MAX and 0 < cols <= INT32_MAX and stride is not None
            and 0 <= stride <= INT32_MAX and ((rows - 1) * stride + cols) * itemsize <= UINT32_MAX)


def span_condition(name: str, rows: int, stride: int | None, cols: int, itemsize: int) -> Condition:
    """Inductor's 32-bit buffer-span condition for a FlyDSL template operand ``name`` with
    ``rows`` rows ``stride`` elements apart, ``cols`` elements per row of ``itemsize`` bytes
    (:func:`fits_inductor`; ``torch/_inductor/kernel/mm_common.py::_fits_int32_buffer_span``)."""
    ok = fits_inductor(rows, stride, cols, itemsize)
    span = ((rows - 1) * stride + cols) * itemsize if stride is not None else "?"
    return cond(f"{name} span", ok, f"{name} spans {span} B"
                + (" (fits 32-bit buffer)" if ok else ": exceeds the 32-bit buffer span or int32 limits"),
                SRC_SPAN_IND)


def aligned_input(t: TensorDesc, assume_aligned: bool) -> bool:
    """Inductor's view of a graph input: aligned when its storage offset in bytes is a
    multiple of 16 (or ``assume_aligned_inputs``) and the tensor is on a GPU."""
    if t.device_type != "cuda":
        return False
    return bool(assume_aligned) or (t.storage_offset * t.itemsize) % GPU_ALIGN_BYTES == 0


def autotune_mode(f, autotuning: bool | None, search_space: str | None) -> tuple[bool, str]:
    """``(FlyDSL autotuning on, search space)`` for a compile: the given values, else the Inductor settings in ``f`` (:class:`flyexplore.world.readiness.EnvFacts`)."""
    at = bool(f.inductor.get("flydsl_enable_autotuning")) if autotuning is None else bool(autotuning)
    ss = str(f.inductor.get("max_autotune_gemm_search_space") or "DEFAULT") if search_space is None else search_space
    return at, ss.upper()



# -- option text (parsed by flyexplore.parsing) ------------------------------------------

def opt_stride(opts: dict, key: str, default):
    """Pop ``key`` (a stride text such as ``4096,1``) from ``opts`` as a tuple of ints, else
    ``default``. Raises :class:`UsageError` for a malformed value."""
    return parse_ints(opts.pop(key), key) if key in opts else default


def opt_offset(opts: dict, key: str) -> int:
    """Pop ``key`` (a storage offset in elements) from ``opts`` as an int, else 0. Raises
    :class:`UsageError` for a malformed value."""
    return parse_ints(opts.pop(key), key)[0] if key in opts else 0
