"""``flyexplore published``: the published MI355X figures as result rows, with the headline numbers
recomputed (:mod:`flyexplore.results.published`)."""
from __future__ import annotations

import argparse
from pathlib import Path

from flyexplore.errors import UsageError, bad_choice

HELP = "the published MI355X figures as result rows, with the headline numbers recomputed"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", help="comma-separated: dense, mxfp, grouped, rmsnorm, topk; or vllm, or "
                   "ranges alone (default: all kernel suites)")
    p.add_argument("--out", help="write the rows: .parquet, .csv or .jsonl (vllm/ranges: .csv, .md, .tex, .html)")


def run(a: argparse.Namespace) -> int:
    # imported here, as in every command module: `flyexplore --help` imports neither torch nor pandas
    import pandas as pd

    from flyexplore.results import published as P
    from flyexplore.results import table as R

    names = [n.strip() for n in (a.suite or "").split(",") if n.strip()] or None
    for n in names or ():
        if n not in P.SUITE_NAMES:
            raise bad_choice("published suite", n, P.SUITE_NAMES)
    special = [n for n in names or () if n in ("vllm", "ranges")]
    if special and len(names) > 1:
        raise UsageError(f"--suite {special[0]} is not per-kernel rows; ask for it alone "
                         f"(kernel suites: {', '.join(P.SUITES)})")
    pd.set_option("display.width", 200)
    if special == ["ranges"]:
        df = P.ranges()
    elif special == ["vllm"]:
        df = P.vllm_published()
    else:
        df = P.load(names)
    if a.out:
        out = Path(a.out)
        if special:
            from flyexplore.views.export import TABLE_FORMATS, save_table
            if out.suffix.lstrip(".") not in TABLE_FORMATS:
                raise UsageError(f"unknown table file extension {out.suffix!r} in {a.out!r} "
                                 f"(valid: {', '.join('.' + f for f in TABLE_FORMATS)})")
            save_table(df, out)
        else:
            R.save(df, out)
        print(f"{len(df)} rows written to {a.out}")
        return 0
    if special:
        print(df.drop(columns=[c for c in ("provenance",) if c in df]).to_string(index=False))
        return 0
    print(P.summary(df).to_string(index=False))
    if names is None:
        print("\nHeadline numbers recomputed from the per-case rows (flyexplore.results.table.speedup/geomean):")
        h = P.headlines(df)
        h["value"] = h["value"].map(lambda v: f"{v:.4f}")
        print(h.to_string(index=False))
        print("\nPublic only as ranges (no per-case values):")
        print(P.ranges()[["what", "subject", "low", "high"]].to_string(index=False))
    print("\nAll rows: status=published, source=published, device AMD Instinct MI355X (gfx950); "
          "not measured by flyexplore. Write them with --out FILE (.parquet, .csv, .jsonl).")
    return 0
