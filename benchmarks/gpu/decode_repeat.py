"""Does a GPU decode step repeat? Issue 44's diagnosis of two decode calls that differ after their
cache is rewound (``data/h100/model_measure/diag.json``).

    python benchmarks/gpu/decode_repeat.py            # writes $OUT/diag.json (or ./diag.json)

Llama-3.1-8B (full depth, random bf16 weights) decode at batch 1 and 32, context 2048, built as the
``model`` family builds it (:func:`flyexplore.ops.model.operator._inputs`, the rewind planned). The
step is called 6 times, each after its rewind, with torch's default SDPA choice and then with
cuDNN's SDPA turned off (``torch.backends.cuda.enable_cudnn_sdp(False)``). Each call's logits go
in against the first call's (relative L2).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    import torch

    from flyexplore.ops import get_op
    from flyexplore.ops.model import operator as M

    op = get_op("model")
    res = {}
    for b in (1, 32):
        inp = M._inputs(op.case(f"{b}x2048:model=llama-3.1-8b,decode"), "bf16", "cuda", 0)
        res[f"b{b}_rewind"] = inp["rewind"].text()
        step = M.step_fn(inp["model"], inp)
        for sdp in ("default", "no_cudnn"):
            torch.backends.cuda.enable_cudnn_sdp(sdp == "default")
            outs = [M.logits(step()).float().clone() for _ in range(6)]
            res[f"b{b}_{sdp}"] = [float((o - outs[0]).norm() / outs[0].norm()) for o in outs]
        torch.backends.cuda.enable_cudnn_sdp(True)
        del inp, step
        torch.cuda.empty_cache()
    print(json.dumps(res, indent=1))
    Path(os.environ.get("OUT", "."), "diag.json").write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
