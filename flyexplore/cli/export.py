"""``flyexplore export``: one figure from result files, as .png/.svg/.pdf (kaleido) or .html
(:mod:`flyexplore.views.export`). The file extension and the input files are checked before
anything heavy is imported."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flyexplore.cli._shared import baseline_arg
from flyexplore.errors import UsageError, bad_choice

HELP = "one figure from result files, as .png/.svg/.pdf (kaleido) or .html"
#: Figures ``flyexplore export`` draws from a result file (see :func:`run`).
EXPORT_FIGURES = ("speedup", "distribution", "sweep", "roofline", "error")
#: Figure file formats, checked before any import (:data:`flyexplore.views.export.FIGURE_FORMATS`;
#: a test keeps the two equal).
FORMATS = ("png", "svg", "pdf", "html")
EPILOG = ("figures: speedup (bars per case against --baseline, 95% whiskers; past 80 cases the "
          "distribution, as the report draws it), distribution (per op and dtype each backend's per-case "
          "speedups sorted, WebGL), sweep "
          "(--y across case parameter --x, one line per backend), roofline (needs a known device), "
          "error (err_rel per case).\nWithout a browser for kaleido a .png/.svg/.pdf request writes "
          ".html instead and says so.\n\nexample:\n  flyexplore export flyexplore-demo/results.parquet "
          "--figure speedup --op gemm --out gemm.png")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = EPILOG
    p.add_argument("results", nargs="+", help="result files (.parquet, .csv, .jsonl)")
    p.add_argument("--figure", default="speedup", choices=EXPORT_FIGURES,
                   help="which figure: " + ", ".join(EXPORT_FIGURES) + " (default speedup)")
    p.add_argument("--out", required=True, help="figure file: .png, .svg, .pdf or .html")
    p.add_argument("--op", help="only this operator's rows")
    p.add_argument("--dtype", help="only this dtype's rows")
    p.add_argument("--baseline", default="aten", help="speedup: backend, or several comma-separated "
                   "(the faster per case); default aten")
    p.add_argument("--x", help="sweep: case parameter on the x axis (default: the first with 3+ values)")
    p.add_argument("--y", default="time_ms", choices=("time_ms", "tflops", "gbps"), help="sweep: the value "
                   "(default time_ms)")
    p.add_argument("--title")
    p.add_argument("--width", type=int, default=1100, help="CSS pixels (default 1100)")
    p.add_argument("--height", type=int, help="CSS pixels (default: the figure's)")
    p.add_argument("--timeout", type=float, help="time limit for the image, s (kaleido's; default 60); "
                   "past it the figure is written as .html")


def run(a: argparse.Namespace) -> int:
    """Check the figure path (extension, writable: nothing is drawn for a path that cannot be
    written), read and validate the result files (:func:`flyexplore.results.table.load_set`),
    then draw and write the figure (:func:`flyexplore.views.export.export_figure`)."""
    if Path(a.out).suffix.lstrip(".").lower() not in FORMATS:
        raise UsageError(f"unknown figure file extension {Path(a.out).suffix!r} in {a.out!r} "
                         f"(valid: {', '.join('.' + f for f in FORMATS)})")
    for f in a.results:
        if not Path(f).exists():
            raise UsageError(f"result file not found: {f!r}")
    if a.timeout is not None and not a.timeout > 0:
        raise UsageError(f"--timeout must be a positive number of seconds, got {a.timeout!r}")
    # imported here, as in every command module: `flyexplore --help` imports neither torch nor pandas
    from flyexplore.results import table as R
    from flyexplore.views import plots as F
    from flyexplore.views.export import check_image_size, check_writable, export_figure

    check_image_size(a.width, a.height, names=("--width", "--height"))
    check_writable(a.out, "figure file")
    df = R.load_set(a.results)
    files = ", ".join(repr(f) for f in a.results)
    for col, v in (("op", a.op), ("dtype", a.dtype)):
        if v is not None:
            if v not in set(df[col].dropna()):
                raise bad_choice(f"{col} in {', '.join(a.results)}", v, sorted(set(df[col].dropna())))
            df = df[df[col] == v]
    if a.figure in ("speedup", "distribution"):
        baseline = baseline_arg(a.baseline)
        R.check_backends(df, baseline, "--baseline", files + (" (the rows selected)" if a.op or a.dtype else ""))
        draw = F.speedup_overview_figure if a.figure == "speedup" else F.speedup_distribution_figure
        fig = draw(df, baseline, title=a.title)
    elif a.figure == "sweep":
        from flyexplore.views.report import _sweep_candidates

        x = a.x or next(iter(_sweep_candidates(df)), None)
        if x is None:
            raise UsageError("no case parameter takes three or more values here; give --x")
        fig = F.sweep_figure(df, x=x, y=a.y, title=a.title)
    elif a.figure == "roofline":
        fig = F.roofline_figure(df, kind="measured", title=a.title)
    else:
        fig = F.error_figure(df, title=a.title)
    kw = {"timeout": a.timeout} if a.timeout is not None else {}
    path, note = export_figure(fig, a.out, width=a.width, height=a.height, **kw)
    if note:
        print(f"flyexplore: note: {note}", file=sys.stderr)
    print(f"figure: {path}")
    return 0
