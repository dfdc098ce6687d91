"""Model capture on a real GPU (issue 21): does the capture equal what eager really runs there, and
what does a model's exported shape list measure?

Run on the lent H200 (``benchmarks/gpu/gpu_model_capture.sh`` runs it with the wheels it needs):

1. **Capture = a real run, on the GPU.** Small Llama and Qwen3-MoE models (2 layers) are built with
   real bf16 weights on ``cuda:0`` and run for real under a ``TorchDispatchMode`` that counts
   (ATen op, input shapes); ``fx.capture`` of the same module on ``cuda:0`` (fake tensors on the
   real device) must give the same counts. The differences, if any, are written out.
2. **A full-depth model captured on the GPU machine**: ``fx.model("llama-3.1-8b")`` and
   ``fx.model("qwen3-30b-a3b")`` at prefill 1x2048 and decode 32 at 2048, with the real device
   present (no capability shim); the tables are written for comparison with the CPU capture.
3. **Exported shapes**: ``cov.shapes()`` of both, written for ``flyexplore sweep --shapes-from``.

``--exact-only`` (issue 34): part 1 alone, on 6-layer models (Llama, Qwen3-MoE, Gemma-2 with
sliding and full attention alternating, Qwen2 with biases), so that identical layers recorded once
and counted (:class:`flyexplore.insight.capture._LayerReuse`) are held to a real run too.

Writes into ``OUT`` (first argument): ``exact.json``, ``<model>_coverage.csv``, ``<model>_text.txt``,
``<model>_shapes.csv``, ``env.json`` (versions, device, time, and the run's provenance under
``provenance``: commit, flyexplore's version, the machine). Runs anywhere; on the CPU it checks the
same on ``cpu``.
"""
from __future__ import annotations

import collections
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def count_real(model, kwargs):
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.c = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kw=None):
            kw = kw or {}
            shapes = tuple(tuple(a.shape) for a in tree_leaves((args, kw)) if isinstance(a, torch.Tensor))
            self.c[(str(func), shapes)] += 1
            return func(*args, **kw)

    with torch.no_grad(), Count() as c:
        model(**kwargs)
    return c.c


def exactness(dev: str, layers: int = 2) -> list[dict]:
    import torch
    import transformers

    import flyexplore as fx

    out = []
    cfgs = {
        "llama-small": {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": layers,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512},
        "qwen3moe-small": {"model_type": "qwen3_moe", "hidden_size": 256, "intermediate_size": 512,
                           "moe_intermediate_size": 128, "num_hidden_layers": layers, "num_attention_heads": 4,
                           "num_key_value_heads": 2, "head_dim": 64, "num_experts": 8, "num_experts_per_tok": 2,
                           "vocab_size": 512},
    }
    if layers > 2:   # issue 34: layers recorded once and counted; sliding and full attention alternating
        cfgs["gemma2-small"] = {"model_type": "gemma2", "hidden_size": 256, "intermediate_size": 512,
                                "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
                                "head_dim": 64, "sliding_window": 16, "vocab_size": 512}
        cfgs["qwen2-small"] = {"model_type": "qwen2", "hidden_size": 256, "intermediate_size": 512,
                               "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
                               "vocab_size": 512}
    for name, d in cfgs.items():
        d = dict(d)
        cfg = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
        torch.manual_seed(0)
        attn = "eager" if d.get("sliding_window") else "sdpa"
        m = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn,
                                                          dtype=torch.bfloat16).to(dev).eval()
        ids = torch.randint(0, 512, (2, 64), device=dev)
        kw = {"input_ids": ids, "use_cache": False}
        real = count_real(m, kw)
        cap = fx.capture(m, kwargs=kw, device=dev)
        got = cap.aten_counts()
        diff = {f"{k[0]} {k[1]}": [real[k], got[k]] for k in set(real) | set(got) if real[k] != got[k]}
        out.append({"model": name, "device": dev, "experts_implementation": getattr(m.config, "_experts_implementation", None),
                    "real_calls": sum(real.values()), "captured_calls": sum(got.values()),
                    "distinct": len(real), "equal": real == got, "differences (real, captured)": diff,
                    "assumptions": cap.assumptions})
        print(name, dev, "equal" if real == got else f"DIFFER: {len(diff)} keys", flush=True)
    return out


def main(out: Path, exact_only: bool = False) -> int:
    import torch

    import flyexplore as fx

    out.mkdir(parents=True, exist_ok=True)
    dev = "cuda:0" if torch.cuda.is_available() else "cpu"
    env = {"python": platform.python_version(), "torch": torch.__version__,
           "device": torch.cuda.get_device_name(0) if dev.startswith("cuda") else platform.processor(),
           "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    import transformers
    from flyexplore.world.env import provenance
    env["transformers"] = transformers.__version__
    env["provenance"] = provenance("benchmarks/gpu/gpu_model_capture.py")
    (out / "env.json").write_text(json.dumps(env, indent=1))
    ex = exactness(dev, layers=6 if exact_only else 2)
    (out / "exact.json").write_text(json.dumps(ex, indent=1, default=str))
    if exact_only:
        return 0 if all(e["equal"] for e in ex) else 1
    for name in ("llama-3.1-8b", "qwen3-30b-a3b"):
        t0 = time.perf_counter()
        cov = fx.model(name, phases=[("prefill", 1, 2048), ("decode", 32, 2048)], device="cuda:0")
        dt = time.perf_counter() - t0
        cov.table.drop(columns=["notes"]).to_csv(out / f"{name}_coverage.csv", index=False)
        (out / f"{name}_text.txt").write_text(cov.text() + f"\n\ncaptured and judged in {dt:.1f} s on {env['device']}\n")
        cov.shapes().to_csv(out / f"{name}_shapes.csv", index=False)
        print(name, f"{dt:.1f} s", flush=True)
    return 0 if all(e["equal"] for e in ex) else 1


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--exact-only"]
    sys.exit(main(Path(args[0] if args else "out/model_capture"), exact_only="--exact-only" in sys.argv))
