"""A MoE's data-dependent expert loop, captured under the stated routing assumption.

Some transformers experts modules loop over the experts their router hit, in Python:
``expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()``, then for each hit
expert ``torch.where(expert_mask[expert_idx])`` for its rows (transformers 5.25
``models/dbrx/modeling_dbrx.py::DbrxExperts.forward``; ``models/mixtral/modeling_mixtral.py::
MixtralExperts.forward``, the "eager" experts implementation many MoEs share). Under fake tensors
those ``nonzero`` sizes are unknown (unbacked symbols) and the loop's length is asked of them, so
the step cannot go on. :class:`ExpertLoop` answers them as the routing assumption
(:data:`ROUTINGS`, :func:`routing_shares`) routes the step's ``tokens x top-k`` rows: the hit
list is every expert given a row (by load rank), each expert's ``where`` gives its rows, and a
host read inside the loop (``expert_idx == num_experts``: the padding class, never hit; a 0-dim
index) is answered for the expert the loop is at. The capture says so in its assumptions
(:meth:`ExpertLoop.note`).
"""
from __future__ import annotations

from typing import Sequence

from flyexplore.errors import UsageError, bad_choice

#: MoE routing assumptions: ``uniform`` (every expert gets the same share of the routed rows) or
#: ``zipf:S`` (expert i, by load rank, gets a share proportional to 1 / (i + 1) ** S; S > 0).
ROUTINGS = ("uniform", "zipf:S")


def routing_shares(routing: str, experts: int) -> list[float]:
    """Each expert's share of the routed rows under ``routing`` (:data:`ROUTINGS`), summing to 1.
    Raises :class:`UsageError` for an unknown routing or a bad exponent."""
    r = str(routing).strip()
    if r == "uniform":
        return [1.0 / experts] * experts
    if r.startswith("zipf:"):
        try:
            s = float(r.split(":", 1)[1])
        except ValueError:
            s = float("nan")
        if not s > 0 or s > 10:
            raise UsageError(f"routing {routing!r}: the zipf exponent must be a number in (0, 10], e.g. zipf:1.1")
        w = [1.0 / (i + 1) ** s for i in range(experts)]
        t = sum(w)
        return [x / t for x in w]
    raise bad_choice("MoE routing", routing, ROUTINGS)


def expert_rows(routing: str, experts: int, rows: int, cap: int | None = None) -> list[int]:
    """The routed rows each expert gets (by load rank) when ``rows`` rows (tokens x top-k) are
    routed as ``routing`` says: the shares of :func:`routing_shares`, rounded by largest
    remainder, so they sum to ``rows``. ``cap``: the most rows one expert can get -- the token
    count, since a token's top-k experts are distinct --: an expert whose share is past it gets
    ``cap`` and the rest is shared out over the others by their shares (so a steep ``zipf`` never
    gives one expert more rows than there are tokens)."""
    shares = routing_shares(routing, experts)
    if cap is not None and cap * experts < rows:
        raise ValueError(f"{rows} rows cannot go to {experts} experts of at most {cap} rows each")
    fixed: dict[int, int] = {}
    while True:
        free = [i for i in range(experts) if i not in fixed]
        left = rows - sum(fixed.values())
        weight = sum(shares[i] for i in free)
        exact = {i: shares[i] / weight * left for i in free}
        over = [i for i in free if cap is not None and exact[i] > cap]
        if not over:
            break
        fixed.update({i: cap for i in over})
    got = {i: int(x) for i, x in exact.items()}
    for i in sorted(free, key=lambda i: (got[i] - exact[i], i))[:left - sum(got.values())]:
        got[i] += 1
    return [fixed.get(i, got.get(i, 0)) for i in range(experts)]


def _num_experts(module) -> int | None:
    for k in ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"):
        v = getattr(module, k, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


class ExpertLoop:
    """Answers the data-dependent calls of experts modules (class names ending in ``Experts``)
    under ``routing`` (module docstring). :meth:`enter` / :meth:`leave` bracket an experts
    module's forward (its positional arguments: the hidden states and the router's
    ``top_k_index`` [tokens, k], an integer tensor); :meth:`answer` returns the fake output of an
    ``aten.nonzero`` or the value of an ``aten._local_scalar_dense`` made inside one, or ``None``
    to let the call run."""

    def __init__(self, routing: str = "uniform"):
        import torch

        routing_shares(routing, 2)   # checks the routing text
        self.routing = routing
        self.torch = torch
        self.nonzero = torch.ops.aten.nonzero.default
        self.scalar = torch.ops.aten._local_scalar_dense.default
        self.stack: list[dict] = []
        self.seen: dict[str, tuple] = {}   # experts class -> (experts, tokens x k, rows per hit expert)

    def enter(self, module, args: Sequence) -> None:
        """An experts module's forward begins: find its experts and routed rows."""
        torch = self.torch
        e = _num_experts(module)
        idx = [a for a in args if isinstance(a, torch.Tensor) and not a.is_floating_point() and a.dim() == 2
               and a.dtype != torch.bool]
        st = None
        if e and idx and all(isinstance(s, int) for s in idx[0].shape):
            rows = idx[0].shape[0] * idx[0].shape[1]
            per = [r for r in expert_rows(self.routing, e, rows, cap=idx[0].shape[0]) if r > 0]
            st = {"cls": type(module).__name__, "experts": e, "rows": rows, "per": per, "at": -1, "answered": False}
        self.stack.append(st)

    def leave(self) -> None:
        """The experts module's forward ended."""
        st = self.stack.pop()
        if st is not None and st["answered"]:
            self.seen[st["cls"]] = (st["experts"], st["rows"], st["per"])

    def answer(self, func, args):
        """The answer for ``func(*args)`` inside an experts module, or ``None``."""
        if not self.stack or self.stack[-1] is None or func not in (self.nonzero, self.scalar):
            return None
        st, torch = self.stack[-1], self.torch
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor):
            return None
        if func is self.nonzero:
            if x.dim() == 1:            # the hit list: every expert the routing gives a row, by load rank
                n = len(st["per"])
                st["at"] = -1
            else:                       # where(expert_mask[e]): the rows of the expert the loop is at
                st["at"] += 1
                n = st["per"][min(st["at"], len(st["per"]) - 1)]
            st["answered"] = True
            return torch.zeros((n, x.dim()), dtype=torch.long, device=x.device)
        if x.dtype == torch.bool:       # expert_idx == num_experts (the padding class): never hit
            st["answered"] = True
            return False
        if not x.is_floating_point():   # a 0-dim expert index: the expert the loop is at
            st["answered"] = True
            return max(st["at"], 0)
        return None

    def note(self) -> str | None:
        """The assumption sentence for the loops answered (``None``: none was)."""
        if not self.seen:
            return None
        parts = []
        for cls, (e, rows, per) in sorted(self.seen.items()):
            hit = f"all {e} experts hit" if len(per) == e else f"{len(per)} of {e} experts hit"
            each = f"{per[0]} rows each" if len(set(per)) == 1 else f"{per[0]} to {per[-1]} rows (by load rank)"
            parts.append(f"{cls} loops over the experts its router hit (a data-dependent nonzero / where): answered "
                         f"as the routing assumption routes its {rows} rows (tokens x top-k): {hit}, {each}")
        return f"MoE routing: {self.routing} -- " + "; ".join(parts)
