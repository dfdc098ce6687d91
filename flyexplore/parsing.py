"""The one parser of option texts: integer lists (``4096,1``, ``8x512``), booleans and
``key=value`` pairs. The operator catalogue's shapes (:meth:`flyexplore.ops.base.Operator.case`),
``flyexplore explain --opt``, the CLI and the widgets all read options through these."""
from __future__ import annotations

import re
from typing import Any, Mapping

from flyexplore.errors import UsageError

#: dtype names used on the command line and in result rows -> torch dtype attribute names.
DTYPE_NAMES = {
    "fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp64": "float64",
    "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2",
    "mxfp8": "float8_e4m3fn", "mxfp4": "float4_e2m1fn_x2",
}


def parse_ints(text: str, what: str) -> tuple[int, ...]:
    """``"4096,1"``, ``"(4096, 1)"`` or ``"8x512"`` -> a tuple of ints (strides, shapes,
    offsets). ``what`` names the option in the error. Raises :class:`UsageError` for text that
    is not integers."""
    try:
        vals = tuple(int(v) for v in re.split(r"[x,]", str(text).strip().strip("()[]")) if v.strip() != "")
    except ValueError:
        raise UsageError(f"malformed {what} {text!r} (expected integers, e.g. 4096,1)") from None
    if not vals:
        raise UsageError(f"malformed {what} {text!r} (expected integers, e.g. 4096,1)")
    return vals


#: The words a boolean option takes (case-insensitive), everywhere: shapes, ``--opt``, widgets.
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def parse_flag(v) -> bool:
    """A boolean option: ``True``/``False`` or one of :data:`TRUE_WORDS` / :data:`FALSE_WORDS`.
    Raises :class:`UsageError` naming the value otherwise."""
    if isinstance(v, bool):
        return v
    s = str(v).lower()
    if s in TRUE_WORDS:
        return True
    if s in FALSE_WORDS:
        return False
    raise UsageError(f"bad boolean {v!r} (use 1/0, true/false)")


def parse_options(text: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """``"a_offset=3; bias=1"`` (``;`` or new lines between ``key=value`` pairs; values may hold
    commas, e.g. ``a_stride=1,4096``) -> ``{"a_offset": "3", "bias": "1"}``. A mapping is
    copied; ``None`` or blank text gives ``{}``. Raises :class:`UsageError` for a pair without
    ``=`` or an empty key (names are checked by :func:`describe`)."""
    if text is None:
        return {}
    if isinstance(text, Mapping):
        return dict(text)
    out: dict[str, Any] = {}
    for tok in filter(None, (t.strip() for t in re.split(r"[;\n]", str(text)))):
        k, eq, v = tok.partition("=")
        if not eq or not k.strip():
            raise UsageError(f"malformed option {tok!r} (expected key=value, pairs separated by ';')")
        out[k.strip()] = v.strip()
    return out


#: Units of ``--max-memory``: decimal (GB = 10**9 bytes) and binary (GiB = 2**30), as nvidia-smi
#: and ``torch.cuda.mem_get_info`` report them (MiB) and as drive makers do (GB).
BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str, name: str) -> int:
    """A byte count from text such as ``40GB``, ``32GiB``, ``1.5e9`` or ``500MiB`` (:data:`BYTE_UNITS`).
    Raises :class:`UsageError` naming ``name`` and the text when it is no positive size."""
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    neg = re.fullmatch(r"\s*-\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    if neg and neg.group(2).lower() in BYTE_UNITS:
        raise UsageError(f"{name} must be a positive size such as 40GB, 32GiB or 5e9 (bytes), got {text!r}")
    if not m or unit not in BYTE_UNITS:
        raise UsageError(f"{name} must be a size such as 40GB, 32GiB or 5e9 (bytes), got {text!r}")
    value = float(m.group(1)) * BYTE_UNITS[unit]
    if not (value >= 1) or value >= 2**63:
        raise UsageError(f"{name} must be at least 1 byte and below 2**63, got {text!r}")
    return int(value)
