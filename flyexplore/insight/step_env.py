"""What model code is told while a step is captured, so that it takes the branches of a real run.

A capture runs the model's own Python under ``FakeTensorMode`` on a machine that may have no GPU.
Code that asks the device (``torch.cuda.get_device_capability``), that counts a FakeTensor as
tracing (transformers' ``is_tracing``), or that reads a tensor on the host (``bool(t)``) is
answered here as a real run on the target would answer it (:func:`target_device`,
:func:`real_run_branches`); torch's logs of a failing fake call are dropped
(:func:`quiet_torch_logs`: the capture raises the failure as one line).
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from flyexplore.errors import bad_choice

if TYPE_CHECKING:
    from flyexplore.insight.capture import _Recorder


#: ``torch.cuda.get_device_capability`` as a ROCm torch reports each target arch (major, minor),
#: answered while capturing on a machine without that GPU (gfx950 = MI350/MI355X: 9.5).
ARCH_CAPABILITY = {"gfx950": (9, 5), "gfx942": (9, 4), "gfx90a": (9, 0), "gfx1201": (12, 0)}


def check_target(arch: str) -> None:
    """Raise :class:`UsageError` unless ``arch`` is a target the capture knows
    (:data:`ARCH_CAPABILITY`)."""
    if arch not in ARCH_CAPABILITY:
        raise bad_choice("target arch", arch, ARCH_CAPABILITY)


@contextlib.contextmanager
def target_device(arch: str, device: str):
    """While capturing fake ``cuda`` tensors on a machine without a GPU, answer
    ``torch.cuda.get_device_capability`` as a ROCm torch on ``arch`` would (:data:`ARCH_CAPABILITY`).
    Yields the sentence the capture adds to its assumptions, or ``None`` when nothing was patched."""
    import torch

    if not str(device).startswith("cuda") or torch.cuda.is_available():
        yield None
        return
    cap = ARCH_CAPABILITY.get(arch, (9, 5))
    orig = torch.cuda.get_device_capability
    torch.cuda.get_device_capability = lambda *a, **k: cap
    try:
        yield (f"no GPU here: fake {device} tensors; torch.cuda.get_device_capability answered {cap} "
               f"(a ROCm torch on {arch}) while capturing")
    finally:
        torch.cuda.get_device_capability = orig


#: Host reads (``bool(t)``, ``t.item()``) inside these transformers functions are answered as a
#: real run of plain sequences answers them: ``{module.function: (answer, what it means)}``.
HOST_READ_ANSWERS = {
    "transformers.masking_utils.find_packed_sequence_indices":
        (True, "transformers' packed-sequence check (masking_utils.find_packed_sequence_indices) reads "
               "position_ids on the host: answered as for plain, unpacked sequences"),
}


@contextlib.contextmanager
def real_run_branches(rec: "_Recorder"):
    """While capturing, let transformers take the branches of a real run.

    Its ``is_tracing`` counts a FakeTensor as tracing (``transformers.utils.import_utils.
    is_fake_tensor``) and then builds explicit attention masks as for ``torch.export``, where a
    real eager run passes ``is_causal=True`` to SDPA: answered ``False`` while capturing. The
    host reads of :data:`HOST_READ_ANSWERS` are answered as stated there (the dispatch mode
    records the read and returns the answer; the capture lists the assumption). Nothing is
    patched when transformers is not imported."""
    import importlib
    import sys

    iu = sys.modules.get("transformers.utils.import_utils")
    if iu is None or not hasattr(iu, "is_fake_tensor"):
        yield
        return
    undo = [(iu, "is_fake_tensor", iu.is_fake_tensor)]
    iu.is_fake_tensor = lambda t: False
    for name, (answer, why) in HOST_READ_ANSWERS.items():
        mod_name, _, fn = name.rpartition(".")
        mod = sys.modules.get(mod_name) or importlib.import_module(mod_name)
        orig = getattr(mod, fn, None)
        if orig is None:
            continue

        def wrapped(*a, _orig=orig, _answer=answer, _why=why, **k):
            rec.host_answers.append((_answer, _why))
            try:
                return _orig(*a, **k)
            finally:
                rec.host_answers.pop()
        undo.append((mod, fn, orig))
        setattr(mod, fn, wrapped)
    try:
        yield
    finally:
        for mod, fn, orig in reversed(undo):
            setattr(mod, fn, orig)


#: torch loggers that log a traceback for a call that fails under ``FakeTensorMode`` before it
#: raises (``log.exception("failed while attempting to run meta for ...")``); the capture raises
#: the failure as one :class:`CaptureError` line, so their records are dropped while capturing.
QUIET_LOGGERS = ("torch._subclasses.fake_tensor",)


@contextlib.contextmanager
def quiet_torch_logs():
    """Drop the records of :data:`QUIET_LOGGERS` while capturing (a filter on each logger, which
    ``TORCH_LOGS`` level settings do not undo); removed on exit."""
    import logging

    def drop(record):
        return False

    loggers = [logging.getLogger(n) for n in QUIET_LOGGERS]
    for lg in loggers:
        lg.addFilter(drop)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(drop)


@contextlib.contextmanager
def compiling(on: bool = True):
    """While capturing the compiled view, answer ``torch.compiler.is_compiling()`` True, as it is
    while Dynamo traces the model: torch 2.15 ``torch/compiler/__init__.py::is_compiling`` reads the
    module flag ``_is_compiling_flag``, which Dynamo sets while it traces, and
    ``torch._dynamo.is_compiling`` / ``torch._utils.is_compiling`` and transformers'
    ``is_torchdynamo_compiling`` (transformers 5.25 ``utils/import_utils.py``) read the same. So model
    code that branches on it takes the branch a compiled run takes (transformers 5.25 on torch 2.15:
    ``masking_utils._ignore_causal_mask_sdpa`` never reads a given padding mask's values under
    compile, so it passes an explicit SDPA mask where eager may pass ``is_causal=True``;
    ``integrations/sdpa_attention.py`` repeats the KV heads for a one-token GQA query instead of
    packing the query; ``find_packed_sequence_indices`` reads nothing on the host). ``on`` False:
    nothing changes. The flag is put back on exit."""
    if not on:
        yield
        return
    import torch.compiler as tc

    had = tc._is_compiling_flag
    tc._is_compiling_flag = True
    try:
        yield
    finally:
        tc._is_compiling_flag = had
