"""Execute every walkthrough notebook headless and keep the executed copies.

    python benchmarks/tools/run_notebooks.py OUT_DIR [--size cpu|gpu|test] [--timeout S] [--only NAME]

For each ``notebooks/*.ipynb``: runs it top to bottom in a fresh kernel with
``SIZE`` and ``OUT=OUT_DIR/<name>-out`` injected below its ``parameters`` cell
(:func:`flyexplore.ui.notebooks.execute`), and writes the executed copy to ``OUT_DIR/<name>.ipynb``
(the plotly.js bundle of FigureWidgets left out: :func:`flyexplore.ui.notebooks.slim_widget_state`).
Also writes ``OUT_DIR/env.json`` (``flyexplore env --json`` with the run's provenance under
``provenance``: commit, flyexplore's version, the machine) and ``OUT_DIR/run.json`` (size,
duration and outcome per notebook; with ``--only NAME`` NAME's entry replaces its earlier one and
the other notebooks' entries already in ``run.json`` are kept: :func:`merge_runs`). A notebook that fails is written up to the failing cell
(whether a cell raised, ran past ``--timeout`` or the kernel died; the failure is in the copy's
metadata, ``metadata["flyexplore"]["failure"]``) and the script goes on; the exit code is 1 if any failed.

Needs the ``notebook`` and ``test`` extras (nbclient, nbformat, ipykernel, ipywidgets,
anywidget). On a 2-core CPU: 10-30 s per notebook. On one H200 with ``--size gpu``: the whole set
is sized for about 5 minutes (what each notebook sweeps: ``flyexplore.ui.notebooks.WALKTHROUGH_SWEEPS``;
only the quickstart autotunes Triton GEMMs, three Llama-3.1-8B shapes, twice -- panel and
code, the second run hitting Inductor's caches). Without a Chromium (GPU nodes) the
static images of ``export_report`` are skipped with the reason; the notebooks still pass.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def merge_runs(old, new: list[dict], order: list[str]) -> list[dict]:
    """``run.json``'s entries after a run: the ``new`` entries, and those of ``old`` (the file's
    earlier entries) for notebooks not run now; in ``order`` (notebook file names), any other
    name after them. ``old`` that is not a list of entries with a ``notebook`` is left out."""
    ran = {r["notebook"] for r in new}
    kept = [r for r in old if isinstance(r, dict) and "notebook" in r and r["notebook"] not in ran] \
        if isinstance(old, list) else []
    rank = {name: i for i, name in enumerate(order)}
    return sorted(kept + new, key=lambda r: rank.get(r["notebook"], len(rank)))


def _earlier_runs(path: Path) -> list:
    """The entries of an earlier ``run.json`` (empty when there is none; an unreadable one is
    said on stderr and replaced)."""
    if not path.exists():
        return []
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"run_notebooks: {path} unreadable ({exc}); written anew", file=sys.stderr)
        return []
    return old if isinstance(old, list) else []


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--size", default="cpu", choices=("cpu", "gpu", "test"))  # flyexplore.ui.notebooks.SIZES
    ap.add_argument("--timeout", type=float, default=900, help="seconds per cell")
    ap.add_argument("--only", default=None, help="run only the notebook with this file name stem")
    ap.add_argument("--keep-widget-js", action="store_true",
                    help="keep the JavaScript bundles of FigureWidgets in the copies (5 MB each)")
    a = ap.parse_args(argv)

    missing = [m for m in ("nbclient", "nbformat", "ipykernel", "ipywidgets", "anywidget")
               if importlib.util.find_spec(m) is None]
    if missing:
        print(f"run_notebooks: missing {', '.join(missing)}; pip install -e '.[notebook,test]'",
              file=sys.stderr)
        return 2

    from flyexplore.ui import notebooks as N
    from flyexplore.world.env import collect, env_json

    paths = [p for p in N.list_notebooks() if a.only in (None, p.stem)]
    if not paths:
        names = ", ".join(p.stem for p in N.list_notebooks())
        print(f"run_notebooks: no notebook named {a.only!r} (valid: {names})", file=sys.stderr)
        return 2
    out = a.out_dir.resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = collect()
    (out / "env.json").write_text(env_json("benchmarks/tools/run_notebooks.py", env))
    runs, failed = [], 0
    for path in paths:
        t0 = time.perf_counter()
        dest = out / path.name
        status, error = "ok", None
        try:
            N.execute(path, dest, parameters={"SIZE": a.size, "OUT": str(out / f"{path.stem}-out")},
                      cwd=out, timeout=a.timeout, slim=not a.keep_widget_js)
        except Exception as exc:  # a failing cell, a cell timeout, a dead kernel: copy written up to it
            status, error = "failed", f"{type(exc).__name__}: {str(exc).strip()[:2000]}"
            failed += 1
            if not dest.exists():  # failed before execute could write (e.g. unreadable notebook)
                import shutil
                shutil.copyfile(path, dest)
        dt = time.perf_counter() - t0
        runs.append({"notebook": path.name, "size": a.size, "status": status, "seconds": round(dt, 1),
                     "error": error, "device": env.device.name, "platform": env.platform})
        print(f"{path.name}: {status} in {dt:.0f} s -> {dest}" + (f"\n  {error[:500]}" if error else ""))
    if a.only is not None:   # the other notebooks' entries of an earlier run stay
        runs = merge_runs(_earlier_runs(out / "run.json"), runs, [p.name for p in N.list_notebooks()])
    (out / "run.json").write_text(json.dumps(runs, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
