"""``flyexplore explain``: would a call take FlyDSL (or AOTriton), and if not, why not
(:mod:`flyexplore.insight.explain`). Its exit code is the answer (:data:`EXIT_YES`, :data:`EXIT_NO`,
:data:`EXIT_UNVERIFIED` of :mod:`flyexplore.cli._shared`)."""
from __future__ import annotations

import argparse
import json

from flyexplore.cli._shared import EXIT_NO, EXIT_UNVERIFIED, EXIT_YES, explain_ops
from flyexplore.errors import UsageError, bad_choice

HELP = "would a call take FlyDSL, and if not, why not"
EPILOG = ("exit codes: 0 FlyDSL YES (attention: eligible), 1 NO (not eligible), "
          "2 usage error, 3 attention: unverified here\n\nexample:\n  flyexplore explain --op gemm "
          "--shape 16x28672x4096:NT --dtype bf16 --assume-rocm --arch gfx950 && echo taken")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = EPILOG
    p.add_argument("--op", required=True, help="rmsnorm, topk, gemm, grouped_gemm, scaled_gemm, attention")
    p.add_argument("--shape", required=True,
                   help="catalogue shape text: 8192x4096 (rmsnorm), 4096x2048x8 (topk), 16x28672x4096:NT "
                        "(gemm), g8x512x4096x4096 (grouped_gemm, M per group), 32x4096x4096 (scaled_gemm), "
                        "1x32x4096x4096x128:causal=1,bwd (attention, BxHxSQxSKVxD)")
    p.add_argument("--dtype", help="bf16, fp16, fp32; mxfp8/mxfp4 for scaled_gemm (default: the operator's first)")
    p.add_argument("--opt", action="append", metavar="KEY=VALUE",
                   help="more of the call: strides, offsets, bias, out_dtype, dim, ...; attention: backend, "
                        "fa_library, device (repeatable)")
    p.add_argument("--arch", help="take this as the device's gcnArchName (e.g. gfx950)")
    p.add_argument("--cu", type=int, help="CU count for TopK's row gate (default: the device's, else 256)")
    p.add_argument("--assume-rocm", action="store_true",
                   help="judge as on a ROCm torch 2.15 with flydsl 0.3.x (what-if on another machine)")
    p.add_argument("--compile-options", help="JSON torch.compile options for GEMMs, or 'current' for this "
                   "process's Inductor config (default: FLYDSL added, max-autotune)")
    p.add_argument("--aotriton", help="attention: judge with this AOTriton version (e.g. 0.14.2, 0.13b); "
                   "default: the bundled one (what-ifs: 0.14.2, torch main's pin)")
    p.add_argument("--json", action="store_true")


def parse_opts(items) -> dict:
    """``--opt`` values (each ``key=value`` pairs separated by ``;``) -> one dict, by
    :func:`flyexplore.parsing.parse_options` (later values win)."""
    from flyexplore.parsing import parse_options

    out = {}
    for it in items or ():
        out.update(parse_options(it))
    return out


def run(a: argparse.Namespace) -> int:
    if a.op not in explain_ops():  # no torch yet
        raise bad_choice("operator for explain", a.op, explain_ops())
    from flyexplore.world.readiness import check_arch

    check_arch(a.arch)  # --arch '' is no arch, not gfx950
    # imported here, as in every command module: `flyexplore --help` imports neither torch nor pandas
    from flyexplore.insight import explain as X
    from flyexplore.ops import get_op

    path = get_op(a.op).flydsl
    if path is not None and path.route == "aotriton":
        ex = X.explain_text(a.op, a.shape, a.dtype, parse_opts(a.opt), arch=a.arch, aotriton=a.aotriton,
                            assume_rocm=a.assume_rocm)
        print(ex.to_json() if a.json else ex.to_text())
        return {"eligible": EXIT_YES, "not eligible": EXIT_NO}.get(ex.verdict, EXIT_UNVERIFIED)
    if a.aotriton is not None:
        raise UsageError(f"--aotriton is for --op attention only (AOTriton operators), not {a.op!r}")
    if path is None:
        raise bad_choice("operator for explain", a.op, explain_ops())
    comp = None
    if path.route == "compile":
        if a.compile_options == "current":
            comp = None
        elif a.compile_options:
            try:
                comp = json.loads(a.compile_options)
            except json.JSONDecodeError:
                raise UsageError(f"--compile-options must be JSON or 'current', got {a.compile_options!r}") from None
            if not isinstance(comp, dict):
                raise UsageError(f"--compile-options must be a JSON object, got {a.compile_options!r}")
        else:
            from torch._inductor import config as ic

            from flyexplore.world.switches import compile_options
            comp = compile_options(True, backends=ic.max_autotune_gemm_backends)
    if a.cu is not None and a.cu <= 0:
        raise UsageError(f"--cu must be a positive CU count, got {a.cu}")
    ex = X.explain_shape(a.op, a.shape, a.dtype, parse_opts(a.opt), arch=a.arch, cu=a.cu,
                         assume_rocm=a.assume_rocm, compile_options=comp)
    if a.json:
        d = ex.to_dict()
        d["compile_options"] = comp
        print(json.dumps(d, indent=2, default=str))
    else:
        if comp is not None:
            print(f"compiled as torch.compile(options={comp}) (--compile-options to change)")
        print(ex.to_text())
    return EXIT_YES if ex.taken else EXIT_NO
