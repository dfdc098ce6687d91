"""The compiled view's ``mm + add -> addmm`` fusion against Inductor's post-grad graph on a GPU (issue 34).

On a GPU Inductor keeps a broadcast bias add apart from its GEMM when every user of the sum is
pointwise, and fuses it when one is not (``torch/_inductor/fx_passes/post_grad.py``:
``should_prefer_unfused_addmm``, ``addmm``); on the CPU it always fuses. The CPU half is held by
``tests/insight/test_model_findings.py``; this script holds the GPU half: for each module (a
Llama-4-like MoE tail, bias adds with pointwise and GEMM users) and dtype it compiles the module
with ``torch.compile`` on ``cuda:0``, reads the GEMM ops of the post-grad graph through
``torch._inductor.config.post_grad_custom_post_pass``, and compares them with
``fx.capture(..., view="compiled")`` of the same module on the same device.

Writes ``OUT/addmm_fusion.json`` (per module and dtype: Inductor's ops, the capture's ops,
``same``) and ``OUT/env.json`` (versions, device, provenance). Usage:
``python benchmarks/gpu/gpu_addmm_fusion.py OUT`` (on the CPU it checks ``cpu``).
"""
from __future__ import annotations

import collections
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def modules():
    """``{name: (module factory, inputs factory)}``: the cases compared."""
    import torch

    class MoETail(torch.nn.Module):
        """transformers' Llama4TextMoe tail: out = shared_expert(x); out.add_(routed)."""

        def __init__(self, n):
            super().__init__()
            self.down_proj = torch.nn.Linear(n, n, bias=False)

        def forward(self, x, routed):
            out = self.down_proj(x)
            out.add_(routed * 2)
            return out

    class BiasPointwise(torch.nn.Module):
        """Linear(bias=False) + b, then pointwise: kept apart on a GPU."""

        def __init__(self, n):
            super().__init__()
            self.proj = torch.nn.Linear(n, n, bias=False)
            self.b = torch.nn.Parameter(torch.zeros(n))

        def forward(self, x, routed):
            return (self.proj(x) + self.b).relu() * routed

    class BiasIntoGemm(torch.nn.Module):
        """Linear(bias=False) + b feeding another GEMM: fused on a GPU too."""

        def __init__(self, n):
            super().__init__()
            self.proj = torch.nn.Linear(n, n, bias=False)
            self.out = torch.nn.Linear(n, n, bias=False)
            self.b = torch.nn.Parameter(torch.zeros(n))

        def forward(self, x, routed):
            return self.out(self.proj(x) + self.b) + routed

    return {"moe_tail": MoETail, "bias_pointwise": BiasPointwise, "bias_into_gemm": BiasIntoGemm}


def inductor_gemms(m, inputs) -> collections.Counter:
    """GEMM ops of the post-grad graph(s) of ``torch.compile(m)(*inputs)``."""
    import torch
    from torch._inductor import config as ic

    seen = collections.Counter()

    def grab(g):
        seen.update(str(n.target) for n in g.nodes if n.op == "call_function" and "mm" in str(n.target))

    torch._dynamo.reset()
    with ic.patch(post_grad_custom_post_pass=grab), torch.no_grad():
        try:
            torch.compile(m)(*inputs)
        except Exception as exc:   # no C++ compiler for the CPU's code: the graph was read before codegen
            if not seen:
                raise
            print(f"  (compile stopped after the post-grad graph: {type(exc).__name__})")
    torch._dynamo.reset()
    return seen


def main(out: Path) -> int:
    import torch

    import flyexplore as fx
    from flyexplore.world.env import provenance

    dev = "cuda:0" if torch.cuda.is_available() else "cpu"
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, cls in modules().items():
        for dt in (torch.bfloat16, torch.float32):
            m = cls(256).to(dev, dt)
            x, r = torch.randn(512, 256, device=dev, dtype=dt), torch.randn(512, 256, device=dev, dtype=dt)
            want = inductor_gemms(m, (x, r))
            cap = fx.capture(m, (x, r), view="compiled", device=dev)
            got = collections.Counter(c.op for c in cap.kernel_calls() if "mm" in c.op)
            rows.append({"module": name, "dtype": str(dt).replace("torch.", ""), "device": dev,
                         "inductor": dict(want), "capture": dict(got), "same": dict(want) == dict(got)})
            print(f"{name:15s} {rows[-1]['dtype']:9s} inductor {dict(want)}  capture {dict(got)}  "
                  f"{'same' if rows[-1]['same'] else 'DIFFERENT'}")
    (out / "addmm_fusion.json").write_text(json.dumps(rows, indent=1))
    env = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0) if dev != "cpu" else "cpu",
           "time": time.strftime("%Y-%m-%d %H:%M:%S %z"), "provenance": provenance()}
    (out / "env.json").write_text(json.dumps(env, indent=1))
    print(f"{sum(r['same'] for r in rows)} of {len(rows)} the same")
    return 0 if all(r["same"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "out/gpu_addmm_fusion")))
