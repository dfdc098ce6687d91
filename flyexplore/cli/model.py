"""``flyexplore model``: will a model take FlyDSL? Capture one forward step of a Hugging Face model
from its config (no weights, no GPU, no hub access), judge every distinct call for the target
arch in the eager and compiled views, advise what-ifs (each re-judged), and show the shares:
FLOPs and bytes captured from the model, the time modelled, a projection if asked, and the
shapes to sweep on an MI350 (:mod:`flyexplore.insight.capture`, :mod:`flyexplore.insight.hf`,
:mod:`flyexplore.insight.coverage`, :mod:`flyexplore.results.model`, :mod:`flyexplore.views.model`).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from flyexplore.atomic import write_text
from flyexplore.cli._shared import EXIT_INTERRUPTED
from flyexplore.errors import UsageError

HELP = "which of a model's calls take FlyDSL (capture a Hugging Face config, judge, project, export shapes)"
EPILOG = ("examples:\n"
          "  flyexplore model --hf llama-3.1-8b --phase prefill --batch 1 --seq 2048\n"
          "  flyexplore model --config config.json --phase prefill:1x2048,decode:32x2048 --json\n"
          "  flyexplore model --hf qwen3-30b-a3b --project published --md coverage.md\n"
          "  flyexplore model --hf qwen3-30b-a3b --export-shapes qwen.csv && \\\n"
          "    flyexplore sweep --op grouped_gemm --shapes-from qwen.csv --out qwen.parquet\n"
          "  flyexplore model --hf llama-3.1-8b --seq 2048 --measure              (measure the step on this device)\n"
          "  flyexplore model --hf llama-3.1-8b --phase decode --batch 32 --measure --variants eager,compile\n"
          "  flyexplore model --config config.json --layers 2 --measure --measure-device cpu\n\n"
          "--measure builds the model with random weights on the device (no download) and times one step\n"
          "per variant, interleaved round by round (the model family: flyexplore sweep --op model takes the\n"
          "same cases, e.g. --shapes 32x2048:model=llama-3.1-8b,decode). Variants: eager, eager_flydsl,\n"
          "compile, max_autotune, max_autotune_flydsl, eager_ck (ROCm), and in CUDA/HIP graphs (GPU):\n"
          "eager_graph, eager_flydsl_graph, compile_graph (mode=reduce-overhead), max_autotune_graph,\n"
          "max_autotune_flydsl_graph; one that cannot run here is an unavailable row with the reason.\n"
          "A decode step's cache states are rewound before each call. --out keeps each row as it finishes:\n"
          "after Ctrl-C or a full disk, the same command with --resume measures the variants still missing\n"
          "(--overwrite replaces the file).\n\n"
          "built-in models (--hf): data/models/*.json (flyexplore model --list)\n"
          "FLOPs and bytes are captured from the model; time shares are modelled (roofline on the target's "
          "datasheet peaks); --project gives a projection, never a measurement.\n\n"
          "limits (checked before anything is built):\n"
          "  a config's sizes must be positive integers and its numbers finite;\n"
          "  no tensor of the step may pass 2**63 bytes (the attention scores [batch, heads, seq, seq]);\n"
          "  past 512 layers, 2,048 experts, an estimated 30 min or the memory available: refused unless --force.\n"
          "The capture costs a few ms a layer and view on a 2-core CPU: identical layers are recorded once, and\n"
          "hidden size, heads, vocabulary, batch and seq cost nothing (a reference scan over the sequence runs\n"
          "per token); a run estimated at a minute or more prints its estimate first.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = EPILOG
    g = p.add_mutually_exclusive_group()
    g.add_argument("--hf", metavar="NAME", help="a built-in config: llama-3.1-8b, qwen3-30b-a3b, mixtral-8x7b, gpt-oss-20b")
    g.add_argument("--config", metavar="FILE", help="a transformers config.json (no weights needed)")
    g.add_argument("--list", action="store_true", help="list the built-in models and exit")
    p.add_argument("--phase", default="prefill", help="prefill, decode, or both comma-separated, each optionally "
                   "with its own BATCHxSEQ: prefill:1x2048,decode:32x2048 (default prefill at --batch x --seq)")
    p.add_argument("--batch", type=int, default=1, help="sequences in the step (default 1)")
    p.add_argument("--seq", type=int, default=2048,
                   help="prefill: tokens per sequence; decode: the context length (default 2048)")
    p.add_argument("--view", default="both", choices=("eager", "compiled", "both"),
                   help="eager: what ATen and the eager overrides see (RMSNorm, TopK); compiled: what Inductor "
                        "lowers (the GEMM templates); both (default)")
    p.add_argument("--arch", default="gfx950", help="target arch to judge for (default gfx950, as --assume-rocm)")
    p.add_argument("--routing", default="uniform", help="MoE routing assumption: uniform (default), or zipf:S "
                   "(expert i by load gets a share proportional to 1/(i+1)**S); sets the per-expert M of "
                   "--export-shapes")
    p.add_argument("--device", default="cuda:0", help="the fake device the model is built on (default cuda:0)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--md", metavar="FILE", help="also write the coverage as Markdown")
    p.add_argument("--report", metavar="DIR", help="also write an HTML report (figure, tables) into DIR")
    p.add_argument("--no-images", action="store_true", help="with --report: no PNG/SVG/PDF figure files")
    p.add_argument("--figure", metavar="FILE", help="also write the modelled-time figure (.html, .png, .svg, .pdf)")
    p.add_argument("--project", choices=("published", "results"),
                   help="project a whole-model speedup (Amdahl) from the published MI355X per-op figures by nearest "
                        "shape, or from a result file measured on MI350 (--speedups)")
    p.add_argument("--speedups", metavar="FILE", help="with --project results: the result file")
    p.add_argument("--export-shapes", metavar="FILE",
                   help="write the captured calls as sweep input (CSV) for flyexplore sweep --shapes-from")
    g2 = p.add_argument_group("measuring the step (--measure)")
    g2.add_argument("--measure", action="store_true",
                    help="also measure the step on this device: random weights, every variant timed interleaved, "
                         "a profiled breakdown beside the modelled shares, the projection beside the measured speedup")
    g2.add_argument("--variants", metavar="LIST",
                    help="comma-separated variants (default all): eager, eager_flydsl, compile, max_autotune, "
                         "max_autotune_flydsl, eager_ck, eager_graph, eager_flydsl_graph, compile_graph, "
                         "max_autotune_graph, max_autotune_flydsl_graph")
    g2.add_argument("--layers", type=int, metavar="N", help="build only the first N decoder layers (a quick look; "
                    "the output says so)")
    g2.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), help="the model's dtype (default the config's)")
    g2.add_argument("--measure-device", metavar="DEV", help="where to measure: cuda, cuda:1, cpu (default a GPU "
                    "when one is visible, else the CPU)")
    g2.add_argument("--max-memory", metavar="BYTES", help="refuse a model whose estimate (weights + KV cache + "
                    "activations) is over this (40GB, 32GiB, 5e9); the device's free memory always applies")
    g2.add_argument("--out", metavar="FILE", help="also keep the measured rows in a result file (.parquet, .csv, "
                    ".jsonl) for flyexplore report / compare; each row is kept as it finishes, as by flyexplore sweep")
    g2.add_argument("--resume", action="store_true", help="with --out: continue the file (after Ctrl-C or a full "
                    "disk): measure only the variants it does not hold yet")
    g2.add_argument("--overwrite", action="store_true", help="with --out: replace an existing file")
    g2.add_argument("--processes", type=int, metavar="N", help="measure in N fresh worker processes and combine "
                    "(intervals that cover another run; GPU)")
    p.add_argument("--force", action="store_true",
                   help="run a model past the limits (512 layers, 2,048 experts, an estimated 30 min, the memory "
                        "available): it may take hours")


def _phases(text: str, batch: int, seq: int) -> list[tuple[str, int, int]]:
    """``--phase`` as ``[(phase, batch, seq)]``: ``prefill``, ``decode``, or several comma-separated,
    each optionally with its own ``:BATCHxSEQ`` (``prefill:1x2048,decode:32x2048``; default
    ``--batch`` x ``--seq``). Raises :class:`UsageError` naming a bad item."""
    from flyexplore.insight.hf import PHASES

    out = []
    for item in (x.strip() for x in str(text).split(",")):
        if not item:
            continue
        ph, _, dims = item.partition(":")
        if ph not in PHASES:
            raise UsageError(f"unknown phase {ph!r} (valid: {', '.join(PHASES)}; e.g. prefill:1x2048,decode:32x2048)")
        b, sq = batch, seq
        if dims:
            parts = dims.lower().split("x")
            if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
                raise UsageError(f"phase {item!r}: give BATCHxSEQ after the colon, e.g. decode:32x2048")
            b, sq = int(parts[0]), int(parts[1])
        out.append((ph, b, sq))
    if not out:
        raise UsageError("no phase given (valid: prefill, decode)")
    return list(dict.fromkeys(out))


def _check_out(path: str | None, what: str, exts: tuple[str, ...]) -> None:
    if not path:
        return
    p = Path(path)
    if exts and p.suffix.lower() not in exts:
        raise UsageError(f"{what} {path!r} must end in {', '.join(exts)}")
    if p.exists() and p.is_dir():
        raise UsageError(f"{what} {path!r} is a folder")
    if not p.parent.exists() if str(p.parent) else False:
        raise UsageError(f"{what} {path!r}: folder {str(p.parent)!r} does not exist")


def model_words(msg: str) -> str:
    """A message of the sweep that ``--measure`` runs, in ``model``'s flags: ``--device`` is
    ``--measure-device``, a variant is a ``--variants`` entry, and a resume with another plan (other
    variants, dtype, layers, ...) is fixed with ``--overwrite`` or another ``--out`` (``model`` has
    no ``--extend``: its file holds one step)."""
    from flyexplore.run.journal import ANOTHER_PLAN_FIX

    msg = msg.replace("--device ", "--measure-device ")
    if msg.startswith("unknown variant "):
        msg = "unknown --variants entry " + msg[len("unknown variant "):]
    return msg.replace(ANOTHER_PLAN_FIX, "use --overwrite to replace it, or choose another --out")


def run(a: argparse.Namespace) -> int:
    # imported here, as in every command module: `flyexplore --help` imports neither torch nor pandas
    from flyexplore.views.model import model_coverage

    if a.list:
        from flyexplore.insight.hf import builtin_models, load_config

        for name, title in builtin_models().items():
            print(f"{name:16s} {title:16s} {load_config(hf=name)['source']}")
        return 0
    if not a.hf and not a.config:
        raise UsageError("give a model: --hf NAME (flyexplore model --list) or --config FILE")
    phases = _phases(a.phase, a.batch, a.seq)
    if a.project == "results" and not a.speedups:
        raise UsageError("--project results needs --speedups FILE (a result file with flydsl rows)")
    if a.speedups and a.project != "results":
        raise UsageError("--speedups is for --project results")
    _check_out(a.md, "--md", (".md",))
    _check_out(a.export_shapes, "--export-shapes", (".csv",))
    _check_out(a.figure, "--figure", (".html", ".png", ".svg", ".pdf"))
    if a.report and Path(a.report).exists() and not Path(a.report).is_dir():
        raise UsageError(f"--report {a.report!r} is a file, not a folder")
    if a.speedups and not Path(a.speedups).is_file():
        raise UsageError(f"--speedups {a.speedups!r}: no such result file")
    measure_only = ("variants", "layers", "dtype", "measure_device", "max_memory", "out", "processes", "resume",
                    "overwrite")
    if not a.measure:
        given = [n for n in measure_only if getattr(a, n) is not None and getattr(a, n) is not False]
        if given:
            raise UsageError(f"--{given[0].replace('_', '-')} is for --measure")
        cov = model_coverage(a.hf, a.config, phases=phases, views=a.view, arch=a.arch, routing=a.routing,
                             device=a.device, project=a.project, speedups=a.speedups, force=a.force)
    else:
        from flyexplore.parsing import parse_bytes
        from flyexplore.views.model_step import measure_model

        if len(phases) != 1:
            raise UsageError("--measure measures one step: give one phase (e.g. --phase decode --batch 32)")
        if a.project == "results":
            raise UsageError("--measure projects from the published figures (--project published)")
        if (a.resume or a.overwrite) and not a.out:
            raise UsageError(f"--{'resume' if a.resume else 'overwrite'} is for the result file: give --out FILE")
        ph, b, sq = phases[0]
        if (a.measure_device or "").startswith("cpu"):   # in this process: the profiler's USDT lines
            from flyexplore.measure.timing import quiet_profiler_log

            quiet_profiler_log()
        try:
            cov = measure_model(a.hf, a.config, phase=ph, batch=b, seq=sq, layers=a.layers, variants=a.variants,
                                dtype=a.dtype, device=a.measure_device,
                                max_memory=parse_bytes(a.max_memory, "--max-memory") if a.max_memory is not None
                                else None, out=a.out, processes=a.processes, arch=a.arch, routing=a.routing,
                                force=a.force, resume=a.resume, overwrite=a.overwrite)
        except UsageError as exc:
            raise UsageError(model_words(str(exc))) from None
        except KeyboardInterrupt:   # Ctrl-C: the finished rows are kept, as a sweep's
            if not a.out:
                raise
            from flyexplore.cli._shared import stopped_line

            print(stopped_line(a.out), file=sys.stderr)
            return EXIT_INTERRUPTED
        if a.out:
            print(f"{len(cov.measured.frame)} rows written to {a.out} (flyexplore report / compare read it)",
                  file=sys.stderr)
    if a.json:
        print(json.dumps(cov.to_dict(), indent=1, default=str, allow_nan=False))
    else:
        print(cov.text())
    if a.md:
        write_text(a.md, cov.markdown())
        print(f"markdown written to {a.md}", file=sys.stderr)
    if a.export_shapes:
        n = cov.export_shapes(a.export_shapes)
        print(f"{n} shape rows written to {a.export_shapes} (flyexplore sweep --op OP --shapes-from "
              f"{a.export_shapes})", file=sys.stderr)
    if a.figure:
        from flyexplore.views.export import save_figure

        save_figure(cov.figure(), a.figure)
        print(f"figure written to {a.figure}", file=sys.stderr)
    if a.report:
        from flyexplore.cli._shared import static_note

        static_note(a.no_images)
        path = cov.report(a.report, static=not a.no_images)
        print(f"report written to {path}", file=sys.stderr)
    return 0
