"""What a family's X-ray builder (``ops/<family>/xray.py``) uses: its answer
(:class:`XRayVerdict`), dtype lookup, a fake CUDA device and a monotone search. The builders run
in the X-ray's compile subprocess (:mod:`flyexplore.insight._xray_worker`), which calls them by
``"module:function"``; they import torch only inside functions.
"""
from __future__ import annotations


class XRayVerdict:
    """A builder's answer: ``eligible`` (torch would run FlyDSL), ``reason`` in words, the torch
    ``predicate`` it comes from, ``builds`` -- ``(family, config dict, specialisation key,
    zero-argument compile function)`` per kernel; one compile per key and batch -- and ``notes``."""

    def __init__(self, eligible, reason, predicate, builds=(), notes=()):
        self.eligible = bool(eligible)
        self.reason = reason
        self.predicate = predicate
        self.builds = list(builds)      # [(family, config dict, spec key, build fn)]
        self.notes = list(notes)


def torch_dtype_named(name):
    """``"bfloat16"`` -> ``torch.bfloat16``."""
    import torch
    return getattr(torch, name)


def fake_cuda():
    """A ``FakeTensorMode`` in which ``device="cuda:0"`` tensors carry shapes only."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    return FakeTensorMode(allow_non_fake_inputs=True)


def min_true(pred, lo=1, hi=(1 << 31) - 1):
    """Smallest x in [lo, hi] with pred(x) true for a predicate monotone in x; None if none."""
    if not pred(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo
