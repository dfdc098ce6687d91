"""Every state a decode step changes in a transformers cache, put back before each timed call.

A decode case times one step -- one new token per sequence at position ``seq`` -- over and over.
For every call to compute the same step, whatever the step changes in the cache must be put
back first (:func:`plan_rewind`). In a transformers 5.2x ``StaticCache``
(``transformers/cache_utils.py``) that is:

- ``StaticLayer`` (full attention): ``update`` writes the new keys/values with ``index_copy_`` at
  ``cumulative_length`` and adds the token count to that counter. Put the counter back and the
  next call writes **the same slot with the same values** (its inputs are the same once every
  other state is back): keys and values need no copy, only the counter is reset.
  ``StaticSlidingWindowLayer`` does the same while its window is not full (it also keeps the
  position as a Python int, ``cumulative_length_int``, put back too); once full it *rolls* its
  keys/values each step, so those are restored like any state.
- ``LinearAttentionLayer`` (the Mamba / Mamba-2 layers of Mamba, Bamba, Jamba, Falcon-H1,
  Granite-4-H; Qwen3-Next's gated-delta-net layers; LFM2's short-conv layers): the conv state
  (the last ``conv_kernel_size`` inputs) and the recurrent / SSM state are updated in place every
  step, and ``cumulative_length_linear`` counts tokens: all are restored from snapshots.

Rather than knowing each class, the plan is found by running the step: every tensor the cache
holds (its layers walked, their dicts and lists too) is snapshotted after the prefill -- the
keys/values of a layer whose next write is a slot (above) only fingerprinted, never copied --,
one step runs, and the tensors that changed (states and position counters) are what each call
restores, with one ``torch._foreach_copy_`` from the snapshots; Python ints and bools on the cache
objects that changed are set back too. Then the step must repeat: two calls after a rewind give
the same logits (exactly on the CPU; within ``tol`` on a GPU) and leave every restored state
where the first call left it; else :class:`~flyexplore.errors.UsageError` names the state that
still moves.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from flyexplore.errors import UsageError

#: The attributes of an attention layer that hold its keys and values.
KV_ATTRS = ("keys", "values")
#: How deep the walk goes from the cache object (cache -> layers -> layer -> dict -> tensor is 4).
MAX_DEPTH = 6


@dataclass
class _Entry:
    """One value found in the cache: ``name`` (``layers[0].conv_states[0]``), where it lives
    (``holder`` and ``key``: an attribute name, or a dict/list index) and the value."""

    name: str
    holder: Any
    key: Any
    value: Any

    def current(self):
        if isinstance(self.holder, (dict, list)):
            return self.holder[self.key]
        return getattr(self.holder, self.key)

    def put(self, value) -> None:
        if isinstance(self.holder, (dict, list)):
            self.holder[self.key] = value
        else:
            setattr(self.holder, self.key, value)


def _descend(obj) -> bool:
    """Whether the walk looks inside ``obj``: a cache object or one of transformers' own (never a
    module, a config, a tensor or a class)."""
    import torch

    if isinstance(obj, (torch.Tensor, torch.nn.Module, type)) or obj is None:
        return False
    mod = type(obj).__module__ or ""
    return hasattr(obj, "__dict__") and (mod.startswith("transformers.") or mod.startswith("flyexplore."))


def walk(cache) -> tuple[list[_Entry], list[_Entry]]:
    """``(tensors, scalars)`` that ``cache`` holds: every tensor and every Python int/bool/float
    reachable from it through attributes of transformers' objects, dicts, lists and tuples (up to
    :data:`MAX_DEPTH`), each once (a tensor reached twice keeps its first name). A tuple's
    items are listed for tensors but cannot be set back (they are read only)."""
    import torch

    tensors, scalars, seen = [], [], set()

    def visit(obj, name, depth):
        if depth > MAX_DEPTH or id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, dict):
            items = list(obj.items())
        elif isinstance(obj, (list, tuple)):
            items = list(enumerate(obj))
        elif depth == 0 or _descend(obj):
            items = [(k, v) for k, v in vars(obj).items() if not k.startswith("__")]
        else:
            return
        for k, v in items:
            sub = f"{name}[{k!r}]" if isinstance(obj, (dict, list, tuple)) else (f"{name}.{k}" if name else str(k))
            sub = sub.replace("['", "[").replace("']", "]")
            if torch.is_tensor(v):
                if id(v) not in seen:
                    seen.add(id(v))
                    tensors.append(_Entry(sub, obj, k, v))
            elif isinstance(v, (bool, int, float)) and not isinstance(obj, tuple):
                scalars.append(_Entry(sub, obj, k, v))
            elif isinstance(v, (dict, list, tuple)) or _descend(v):
                visit(v, sub, depth + 1)

    visit(cache, "", 0)
    return tensors, scalars


def _writes_a_slot(layer) -> bool:
    """Whether an attention layer's next ``update`` writes one slot at its position counter
    (``StaticLayer``; ``StaticSlidingWindowLayer`` until its window is full) rather than moving
    what it holds: a tensor ``cumulative_length`` below ``max_cache_len``."""
    import torch

    pos = getattr(layer, "cumulative_length_int", None)
    if pos is None:
        c = getattr(layer, "cumulative_length", None)
        pos = int(c) if torch.is_tensor(c) and c.numel() == 1 else None
    cap = getattr(layer, "max_cache_len", None)
    return isinstance(pos, int) and isinstance(cap, int) and pos < cap


def _rel(a, b) -> float:
    """Relative L2 difference of two tensors (float64), 0 for equal ones."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return float("inf")
    if torch.equal(a, b):
        return 0.0
    d = (a.double() - b.double()).norm()
    n = b.double().norm()
    return float(d / n) if n > 0 else float("inf")


@dataclass
class Rewind:
    """Puts a decode step's cache back as the prefill left it: ``dst`` (the live tensors that the
    step changes: states and position counters) get ``src`` (their snapshots) in one
    ``torch._foreach_copy_``, and ``scalars`` (Python values on the cache's objects: ``(entry,
    value)``) are set back. Calling it inside a captured CUDA/HIP graph records the copy, so each
    replay rewinds; the Python values matter only where Python runs (eager calls, the capture).
    ``names``: what is restored; ``kv_slots``: the keys/values rewritten at one slot (not
    copied)."""

    dst: list = field(default_factory=list)
    src: list = field(default_factory=list)
    scalars: list = field(default_factory=list)
    names: list = field(default_factory=list)
    kv_slots: list = field(default_factory=list)
    #: relative L2 difference of the logits of two calls after a rewind (0 where they are equal; on a
    #: GPU a kernel whose reduction order varies from call to call makes it non-zero)
    repeat_err: float = 0.0

    def __call__(self) -> None:
        import torch

        for e, v in self.scalars:
            e.put(v)
        if self.dst:
            torch._foreach_copy_(self.dst, self.src)

    def __repr__(self) -> str:   # no object address: a case's input digest covers its text
        return f"Rewind({len(self.dst)} tensors, {self.bytes} bytes)"

    @property
    def bytes(self) -> int:
        """Bytes copied per call (every restored tensor's storage; the snapshots hold as many)."""
        return int(sum(t.numel() * t.element_size() for t in self.dst))

    @property
    def counters(self) -> int:
        """How many of the restored tensors are position counters (one element, an integer dtype)."""
        return sum(1 for t in self.dst if t.numel() == 1 and not t.is_floating_point())

    def text(self) -> str:
        """The rewind in words: what each call restores and what it costs."""
        states = len(self.dst) - self.counters
        kb = self.bytes / 1024
        kv = (f"; {len(self.kv_slots)} KV keys/values tensors rewritten at the same slot (no copy)"
              if self.kv_slots else "")
        rep = (f"; two calls after a rewind differ by {self.repeat_err:.2g} relative (logits: a kernel that is not "
               "bitwise repeatable, e.g. cuDNN's SDPA)" if self.repeat_err else "; two calls after a rewind are equal")
        return (f"decode rewind: {states} state tensor(s) and {self.counters} position counter(s) restored per call, "
                f"{kb:.1f} KiB copied{kv}{rep}")


def plan_rewind(cache, step: Callable[[], Any], tol: float = 0.0) -> Rewind:
    """Find what a decode ``step`` changes in ``cache`` and return the :class:`Rewind` that puts it
    back (the module text): snapshot, one step, compare, then check that the step repeats -- two
    calls after a rewind give logits within ``tol`` (relative L2; 0: equal) and leave every
    restored state within ``tol`` of where the first call left it. ``step``: a zero-argument
    callable running one decode step and returning its logits (a tensor). The cache is left
    rewound (as the prefill left it). Raises :class:`UsageError` (one line) naming a state the step
    reassigns instead of updating in place, or the state that still moves (or saying none in the
    cache does: the state is outside it)."""
    import torch

    tensors, scalars = walk(cache)
    kv_ok = {id(e.value) for e in tensors if e.key in KV_ATTRS and not isinstance(e.holder, (dict, list, tuple))
             and _writes_a_slot(e.holder)}
    snap = {e.name: e.value.clone() for e in tensors if id(e.value) not in kv_ok}
    before = {e.name: e.value for e in scalars}
    first = step()
    moved_t, kv = [], []
    for e in tensors:
        now = e.current() if not isinstance(e.holder, tuple) else e.value
        if now is not e.value:
            raise UsageError(f"decode state {e.name} is replaced by a new tensor each step, not updated in place: "
                             "the step cannot be rewound")
        if id(e.value) in kv_ok:
            kv.append(e.name)
        elif not torch.equal(snap[e.name], e.value):
            if isinstance(e.holder, tuple):
                raise UsageError(f"decode state {e.name} changes each step but sits in a tuple: cannot be rewound")
            moved_t.append(e)
    moved_s = [(e, before[e.name]) for e in scalars if e.current() != before[e.name]]
    rw = Rewind(dst=[e.value for e in moved_t], src=[snap[e.name] for e in moved_t], scalars=moved_s,
                names=[e.name for e in moved_t] + [e.name for e, _ in moved_s], kv_slots=kv)
    after1 = {e.name: e.value.clone() for e in moved_t}
    after1_s = {e.name: e.current() for e in scalars}
    rw()
    second = step()
    # where step 2 left each state against where step 1 left it (the unchanged ones: against the snapshot)
    diffs = [(e.name, _rel(e.value, after1[e.name] if e.name in after1 else snap[e.name]))
             for e in tensors if id(e.value) not in kv_ok]
    diffs += [(e.name, 0.0 if e.current() == after1_s[e.name] else float("inf")) for e in scalars]
    rw()
    del snap, after1
    err = _rel(second.detach().float(), first.detach().float())
    worst = max(diffs, key=lambda x: x[1], default=None)
    if worst is not None and worst[1] <= tol:
        worst = None
    if err > tol or worst is not None:
        what = (f"state {worst[0]} still moves" if worst is not None
                else "no cache state moves (the changing state is outside the cache)")
        raise UsageError(f"decode step does not repeat after its cache is rewound (logits differ by {err:.3g} "
                         f"relative, more than {tol:.3g}): {what}")
    rw.repeat_err = err
    return rw
