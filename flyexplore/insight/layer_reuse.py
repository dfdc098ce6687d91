"""Decoder layers: identical layers recorded once (:class:`_LayerReuse`), and which layers made the same calls (:func:`layer_kinds`)."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Sequence

from flyexplore.insight.calls import _LAYER, _PLAIN, Capture

if TYPE_CHECKING:
    from flyexplore.insight.capture import _Recorder


#: Attribute names under which a layer keeps its own index (transformers: ``layer_idx``).
INDEX_ATTRS = ("layer_idx", "layer_id", "layer_index", "layer_number", "idx", "index")


def _attr_sig(name: str, v, index: int):
    """What a layer's attribute says of its calls: plain values by value (the layer's own index,
    an int equal to it under one of :data:`INDEX_ATTRS`, as ``<index>``), lists of plain values
    by value, callables by name, anything else by type."""
    if isinstance(v, bool) or v is None or isinstance(v, (float, str)):
        return v
    if isinstance(v, int):
        return "<index>" if v == index and name in INDEX_ATTRS else v
    if isinstance(v, (list, tuple)) and all(isinstance(x, _PLAIN) for x in v):
        return tuple(v)
    if callable(v) and hasattr(v, "__qualname__"):
        return f"{getattr(v, '__module__', '')}.{v.__qualname__}"
    return type(v).__name__


def _module_sig(root, index: int) -> tuple:
    """A layer module as the calls it can make depend on it: for each submodule its relative
    name, class, public attributes (:func:`_attr_sig`) and its own parameters' and buffers'
    shapes, strides and dtypes."""
    out = []
    for name, sub in root.named_modules():
        attrs = tuple((a, _attr_sig(a, v, index)) for a, v in sorted(vars(sub).items())
                      if not a.startswith("_") and a != "training")
        params = tuple((n, tuple(p.shape), tuple(p.stride()), p.dtype)
                       for n, p in sub.named_parameters(recurse=False))
        bufs = tuple((n, tuple(b.shape), b.dtype) for n, b in sub.named_buffers(recurse=False) if b is not None)
        out.append((name, type(sub).__name__, attrs, params, bufs))
    return tuple(out)


class _LayerReuse:
    """Records each kind of decoder layer once (issue 34: capture time grows with the distinct
    calls, not with depth or, for a scan in reference code, with layers x sequence length).

    The elements of a model's top-level layer list (module paths ending in their first list
    index, ``model.layers.5``) are wrapped for the step. A layer whose module signature
    (:func:`_module_sig`: classes, attributes -- its own index (:data:`INDEX_ATTRS`) aside -- and parameter shapes of
    every submodule) and inputs (each tensor's shape, strides, dtype, device and
    :func:`offset_class`; other objects by value or type) equal those of a layer recorded before
    is not run: the earlier layer's rows are added again under this layer's path, with their
    counts, and its outputs are fresh fake tensors of the earlier outputs' shapes, strides and
    dtypes (made unrecorded). Per-layer differences that transformers decides at build time
    (sliding vs full attention, MoE vs dense MLP, layers without RoPE, linear attention) show in
    the signature; ``tests/insight/test_capture_speed.py`` holds captures with and without it
    equal. ``decode`` caches of reused layers are not updated (nothing of the step reads them
    again)."""

    def __init__(self, model, rec: "_Recorder"):
        self.rec, self.seen, self.sigs, self.undo = rec, {}, {}, []
        self.reused: list[tuple[int, int, str]] = []   # (index, source index, the list's path)
        for path, m in model.named_modules():
            mt = _LAYER.search(path)
            if mt is None or mt.end() != len(path):
                continue
            k = int(mt.group(1))
            had = "forward" in vars(m)
            self.undo.append((m, had, vars(m).get("forward")))
            m.forward = self._wrap(path, k, m, m.forward)

    def restore(self) -> None:
        """Put every wrapped layer's ``forward`` back."""
        for m, had, fwd in self.undo:
            if had:
                m.forward = fwd
            else:
                del m.forward

    def _inputs_sig(self, args, kwargs) -> tuple | None:
        import torch
        from torch.utils._pytree import tree_flatten

        leaves, spec = tree_flatten((args, kwargs))
        out = []
        for x in leaves:
            if isinstance(x, torch.Tensor):
                d = self.rec.desc(x)
                if d[1] is None:
                    return None   # symbolic or undescribable: record it
                out.append(d[1])
            elif isinstance(x, _PLAIN):
                out.append(x)
            else:
                out.append(type(x).__name__)
        return (str(spec), tuple(out))

    def _wrap(self, path: str, k: int, m, fwd):
        rec = self.rec

        def forward(*args, **kwargs):
            if rec.inner or rec.silent:
                return fwd(*args, **kwargs)
            ms = self.sigs.get(id(m))
            if ms is None:
                ms = self.sigs[id(m)] = _module_sig(m, k)
            ins = self._inputs_sig(args, kwargs)
            key = None if ins is None else (ms, ins)
            got = self.seen.get(key) if key is not None else None
            if got is not None:
                return self._reuse(got, path, k)
            start, ustart = len(rec.calls), len(rec.uncaptured)
            out = fwd(*args, **kwargs)
            if key is not None:
                self.seen[key] = {"path": path, "k": k, "start": start, "end": len(rec.calls),
                                  "ustart": ustart, "uend": len(rec.uncaptured), "out": out}
            return out
        return forward

    def _reuse(self, got: dict, path: str, k: int):
        import torch
        from torch.utils._pytree import tree_map

        rec = self.rec
        src = got["path"]

        def moved(p: str) -> str:
            return path + p[len(src):] if p == src or p.startswith(src + ".") else p

        n = 0
        for i in range(got["start"], got["end"]):
            c, cnt = rec.calls[i], rec.counts[i]
            if cnt < 1:
                continue
            rec.calls.append(replace(c, module=moved(c.module), layer=k if c.layer == got["k"] else c.layer))
            rec.counts.append(cnt)
            rec.rowkeys.append(None)
            rec.first_offsets.append(rec.first_offsets[i])
            rec.moved.append(rec.moved[i])
            n += cnt
        rec.uncaptured += [{**u, "module": moved(u["module"])} for u in rec.uncaptured[got["ustart"]:got["uend"]]]
        rec.n += n
        self.reused.append((k, got["k"], path.rsplit(".", 1)[0] if "." in path else ""))

        def fresh(t):
            if not isinstance(t, torch.Tensor):
                return t
            return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=t.device)

        rec.silent = True
        try:
            return tree_map(fresh, got["out"])
        finally:
            rec.silent = False

    def note(self) -> str | None:
        """The assumption line saying which layers were counted from which (``None``: none)."""
        if not self.reused:
            return None
        # grouped by the list they sit in (its indices above them as *: Gemma-3n's per-layer
        # altup_projections are one list in every layer) and the index they were counted from
        by: dict[tuple[str, int], set[int]] = {}
        for k, src, lst in self.reused:
            by.setdefault((_LAYER.sub(".*", lst), src), set()).add(k)
        def say(lst: str, src: int, ks: set[int]) -> str:
            if lst.rsplit(".", 1)[-1] == "layers" and "*" not in lst:   # the decoder layers
                return f"{'layers' if len(ks) > 1 else 'layer'} {_ranges(sorted(ks))} as layer {src}"
            each = " (in each layer)" if "*" in lst else ""
            return f"{lst} items {_ranges(sorted(ks))} as item {src}{each}"
        parts = "; ".join(say(lst, src, ks) for (lst, src), ks in sorted(by.items()))
        return (f"identical layers recorded once: {parts} (same classes, attributes and parameter shapes, same "
                "input shapes and strides): their calls counted from the recorded layer "
                "(FLYEXPLORE_CAPTURE_EVERY_LAYER=1 records every layer)")


def _layer_count(model) -> int:
    """The number of list-indexed layers of ``model`` (first list index of its module paths)."""
    idx = set()
    for path, _ in model.named_modules():
        m = _LAYER.search(path)
        if m:
            idx.add(int(m.group(1)))
    return len(idx)


def layer_kinds(cap: Capture, layer_types: Sequence[str] | None = None) -> dict:
    """Which list-indexed layers made the same calls: ``{"count": n, "kinds": [{"layers": [...],
    "calls": k}, ...], "text": "..."}``, from each layer's sequence of kernel calls
    (:meth:`Call.key` and count; ``calls``: the kernel calls per layer, folded ones counted). One kind = every layer identical; a hybrid model (sliding and full
    attention, dense and MoE MLPs, linear attention) has several. Layers are taken from the
    first list index of each module path, in the list whose elements make the most calls (the
    decoder layers; another list, Gemma-3n's ``altup_projections``, is not layers). ``layer_types``: the config's name per layer
    (``layer_types`` of a hybrid config: ``sliding_attention``, ``full_attention``,
    ``linear_attention``), added to each kind (``types``) and to the text."""
    seqs: dict[int, list] = {}
    # the layer list is the list whose elements make the most calls (Gemma-3n's altup_projections.N
    # are a list too, not layers)
    weight: dict[str, int] = {}
    for c in cap.kernel_calls():
        m = _LAYER.search(c.module) if c.layer is not None else None
        if m:
            weight[c.module[:m.start()]] = weight.get(c.module[:m.start()], 0) + c.count
    main = max(weight, key=weight.get) if weight else None
    for c in cap.kernel_calls():
        m = _LAYER.search(c.module) if c.layer is not None else None
        if m and c.module[:m.start()] == main:
            seqs.setdefault(c.layer, []).append((c.key(), c.count))
    kinds: list[dict] = []
    for i in sorted(seqs):
        sig = tuple(seqs[i])
        for k in kinds:
            if k["sig"] == sig:
                k["layers"].append(i)
                break
        else:
            kinds.append({"sig": sig, "layers": [i], "calls": sum(n for _, n in sig)})
    for k in kinds:
        del k["sig"]
        if layer_types:
            k["types"] = sorted({str(layer_types[i]) for i in k["layers"] if i < len(layer_types)})
    n = len(seqs)
    if not n:
        text = "no list-indexed layers"
    elif len(kinds) == 1:
        text = f"{n} layers captured, all identical ({kinds[0]['calls']} kernel calls each)"
    else:
        text = (f"{n} layers captured, {len(kinds)} kinds: "
                + "; ".join(f"layers {_ranges(k['layers'])} ({len(k['layers'])} x {k['calls']} calls"
                            + (f", {'/'.join(k['types'])}" if k.get("types") else "") + ")"
                            for k in kinds))
    if layer_types and len(kinds) == 1 and len(set(layer_types)) > 1:
        text += (f" (the config's layer kinds {', '.join(sorted(set(map(str, layer_types))))} make the same calls "
                 "in this step)")
    return {"count": n, "kinds": kinds, "text": text}


def _ranges(xs: Sequence[int]) -> str:
    xs = sorted(xs)
    if len(xs) > 2 and all(b - a == xs[1] - xs[0] for a, b in zip(xs, xs[1:])):
        step = xs[1] - xs[0]
        return f"{xs[0]}-{xs[-1]}" + (f" every {step}" if step > 1 else "")
    return ",".join(map(str, xs))
