"""Which SDPA backend can run an attention call, asked of torch itself: the probes behind the
attention catalogue's backend availability (:mod:`flyexplore.ops.attention.operator`) and the FlyDSL
explainer's SDPA conditions (:mod:`flyexplore.ops.attention.flydsl`). ``explain(backend, case,
dtype, device, platform)`` returns ``None`` when torch's own check (``can_use_flash_attention``
/ ``can_use_efficient_attention`` / cuDNN's, with ``debug=True``) accepts the call, else the
reason torch prints.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import warnings

from flyexplore.ops.base import torch_dtype

_C10_WARNING = re.compile(r"Warning: (.*?)(?: \(function \w+\))?$")


def kv_heads(case) -> int:
    """Key/value heads: ``hkv`` or, when 0, ``h``."""
    return case["hkv"] or case["h"]


@contextlib.contextmanager
def captured_stderr_fd():
    """Capture what C++ code writes to file descriptor 2 (c10's TORCH_WARN output) for the
    block, with ``torch.set_warn_always(True)`` so that once-only warnings repeat. Yields a
    dict whose ``"text"`` is filled on exit."""
    import torch

    box = {"text": ""}
    sys.stderr.flush()
    saved = os.dup(2)
    always = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield box
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            torch.set_warn_always(always)
            tmp.seek(0)
            box["text"] = tmp.read().decode(errors="replace")


def _messages(stderr_text: str, caught) -> list[str]:
    out = []
    for line in stderr_text.splitlines():
        m = _C10_WARNING.search(line.strip())
        if m:
            out.append(m.group(1).strip())
    out += [str(w.message).strip() for w in caught]
    return list(dict.fromkeys(x for x in out if x))


def _probe_tensors(case, dtype, device):
    import torch

    dt = torch_dtype(dtype)
    b, h, sq, skv, d, hk = case["b"], case["h"], case["sq"], case["skv"], case["d"], kv_heads(case)
    grad = case["pass"] == "bwd"
    mk = lambda *s: torch.empty(*s, device=device, dtype=dt, requires_grad=grad)  # noqa: E731
    return mk(b, h, sq, d), mk(b, hk, skv, d), mk(b, hk, skv, d)


_SDP_NAMES = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
              "cudnn": "CUDNN_ATTENTION", "ck": "FLASH_ATTENTION", "math": "MATH"}
_CAN_USE = {"flash": "can_use_flash_attention", "efficient": "can_use_efficient_attention",
            "cudnn": "can_use_cudnn_attention", "ck": "can_use_flash_attention"}


def _sdpa_params(q, k, v, causal, gqa):
    import torch

    P = torch.backends.cuda.SDPAParams
    try:
        return P(q, k, v, None, 0.0, causal, gqa)
    except TypeError:  # torch < 2.5: no enable_gqa
        return P(q, k, v, None, 0.0, causal)


def explain(backend: str, case, dtype, device, platform: str) -> str | None:
    """Why SDPA backend ``backend`` cannot run ``case`` on ``device`` (None when it can), in
    torch's words where torch gives them. ``platform`` is ``cpu``, ``cuda`` or ``rocm``.

    GPU: ``torch.backends.cuda.can_use_*_attention(params, debug=True)``, whose reasons go
    through c10's warning handler to stderr and are captured here. CPU: ``torch._fused_sdp_choice``
    with SDPA restricted to the backend (torch's CPU dispatcher offers FLASH_ATTENTION -- its
    CPU flash kernel -- and MATH only).
    """
    import torch

    if backend in ("math", "default"):
        return None
    if backend == "cudnn" and platform != "cuda":
        return ("cuDNN attention is NVIDIA-only" if platform == "rocm" else
                "cuDNN attention needs an NVIDIA GPU (CUDNN_ATTENTION is a CUDA backend)")
    if backend == "ck" and platform != "rocm":
        return ("CK flash attention is ROCm-only (torch.backends.cuda.preferred_rocm_fa_library"
                "('ck'))")
    if backend == "ck":
        ck = getattr(torch.backends.cuda, "is_ck_sdpa_available", None)
        if ck is not None and not ck():
            return ("this ROCm build of torch has no CK attention "
                    "(torch.backends.cuda.is_ck_sdpa_available() is False)")
    q, k, v = _probe_tensors(case, dtype, device)
    gqa = kv_heads(case) != case["h"]
    if platform == "cpu":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        sdp = getattr(SDPBackend, _SDP_NAMES[backend])
        with warnings.catch_warnings(record=True) as caught, captured_stderr_fd() as err:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel([sdp]):
                    choice = torch._fused_sdp_choice(q, k, v, attn_mask=None, dropout_p=0.0,
                                                     is_causal=case["causal"], enable_gqa=gqa)
                ok = int(choice) == int(sdp)
                msg = None if ok else f"torch's CPU dispatcher chose backend {int(choice)}"
            except RuntimeError as exc:
                ok, msg = False, str(exc).strip().splitlines()[0]
            if not ok and backend == "efficient":
                try:  # its debug output names the CUDA-only requirement
                    _sdpa_params_check(backend, q, k, v, case["causal"], gqa)
                except Exception:  # noqa: BLE001 - only its printed reasons matter here
                    pass
        if ok:
            return None
        msgs = _messages(err["text"], caught)
        return ("on CPU torch offers only FLASH_ATTENTION (its CPU flash kernel) and MATH; "
                f"torch says: {'; '.join([msg] + msgs if msg else msgs)}")
    with _rocm_library(backend, platform):
        with warnings.catch_warnings(record=True) as caught, captured_stderr_fd() as err:
            warnings.simplefilter("always")
            try:
                ok = _sdpa_params_check(backend, q, k, v, case["causal"], gqa)
                extra = []
            except Exception as exc:  # an old torch without the check, or the check failing
                ok, extra = False, [f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"]
    if ok:
        return None
    msgs = extra + _messages(err["text"], caught)
    fn = _CAN_USE[backend]
    return f"torch.backends.cuda.{fn} says no: " + ("; ".join(msgs) or "(no reason printed)")


def _sdpa_params_check(backend, q, k, v, causal, gqa) -> bool:
    import torch

    fn = getattr(torch.backends.cuda, _CAN_USE[backend])
    return bool(fn(_sdpa_params(q, k, v, causal, gqa), True))


@contextlib.contextmanager
def _rocm_library(backend: str, platform: str):
    """On ROCm pin the flash-attention library for ``flash``/``efficient`` (AOTriton) and
    ``ck`` (Composable Kernel), restoring the previous preference afterwards."""
    import torch

    if platform != "rocm" or backend not in ("flash", "efficient", "ck"):
        yield
        return
    pref = torch.backends.cuda.preferred_rocm_fa_library
    before = pref()
    pref("ck" if backend == "ck" else "aotriton")
    try:
        yield
    finally:
        pref(before)
