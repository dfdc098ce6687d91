"""``flyexplore history``: results over time. ``add`` puts result files into a history store
(:mod:`flyexplore.results.history_store`), ``show`` reads each case's trend and the geometric
mean's, the steps in them, the build series and the learned cross-run allowance
(:mod:`flyexplore.results.history`; ``--out`` the report with its figure,
:mod:`flyexplore.views.history`; ``--fail-on`` a CI gate on the newest step), ``export`` writes a
run for Bencher (BMF) or github-action-benchmark."""
from __future__ import annotations

import argparse
import json
import sys

from flyexplore.cli._shared import EXIT_NO, static_note
from flyexplore.errors import UsageError

HELP = "results over time: add result files to a history store, show trends and steps (--fail-on), export (BMF)"

DESCRIPTION = """\
A history store keeps every run added to it (append-only; adding a file twice changes nothing;
two adds at once are safe). The store is --store DIR, else $FLYEXPLORE_HISTORY, else
$XDG_DATA_HOME/flyexplore/history (~/.local/share/flyexplore/history).

  flyexplore history add FILE... [--store DIR]
  flyexplore history show [--store DIR] [--json FILE|-] [--out DIR] [--fail-on SLOWER:5%] [--recent N]
  flyexplore history export --format bmf|github-action-benchmark --out FILE [--run RUN_ID] [--store DIR]

show: per device model, the geometric mean's trend, the steps found in each case (run, size and
95% interval; a weighted piecewise-constant fit, asv's method) and the cross-run allowance learned
from identical runs (used by flyexplore compare for two files of one device); a build series (an
A/B of three or more environments) says between which builds a step happened.
--fail-on SLOWER[:THRESHOLD] exits 1 when a series' newest step (of the newest --recent N runs)
made it slower by more than THRESHOLD at its interval's favourable end.

exit status: 0 done; 1 --fail-on tripped; 2 usage error (a damaged or foreign file or store,
an unwritable output; nothing written).

CI recipe (docs/history.md):
  flyexplore sweep --op gemm --suite llama3.1-8b --out run.parquet
  flyexplore history add run.parquet --store history/
  flyexplore history show --store history/ --fail-on SLOWER:5% --recent 1
  flyexplore history export --store history/ --format bmf --out bmf.json
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = DESCRIPTION
    sub = p.add_subparsers(dest="action", required=True, parser_class=type(p))
    a = sub.add_parser("add", help="add result files to the store")
    a.add_argument("files", nargs="+", metavar="FILE", help="result files (.parquet, .csv, .jsonl) of sweeps")
    s = sub.add_parser("show", help="trends, steps, build series and the learned allowance")
    s.add_argument("--json", metavar="FILE", help="write the tables as JSON (- : stdout, the text to stderr)")
    s.add_argument("--out", metavar="DIR", help="also write the history report (report.html with its figures)")
    s.add_argument("--no-images", action="store_true", help="skip the PNG/SVG/PDF figure files of --out")
    s.add_argument("--device", help="only runs of this device (a device name as rows give it, or a device_id)")
    s.add_argument("--fail-on", metavar="SLOWER[:THRESHOLD]", help="exit 1 when a series' newest step made it "
                   "slower by more than THRESHOLD (5%% or 0.05) at its interval's favourable end")
    s.add_argument("--recent", type=int, metavar="N", help="--fail-on: only steps within the newest N runs "
                   "of their device (default: every series' newest step, however old)")
    s.add_argument("--top", type=int, default=10, metavar="N", help="largest case steps listed per device (10)")
    e = sub.add_parser("export", help="one run as Bencher Metric Format or github-action-benchmark JSON")
    e.add_argument("--format", required=True, help="bmf | github-action-benchmark")
    e.add_argument("--out", required=True, metavar="FILE", help="the JSON file to write (- : stdout)")
    e.add_argument("--run", dest="run_id", metavar="RUN_ID", help="the run to export (default: the newest, of "
                   "--device when given)")
    e.add_argument("--device", help="the newest run of this device (a device name as rows give it, or a device key)")
    for q in (a, s, e):
        q.add_argument("--store", metavar="DIR", help="the history store (default: $FLYEXPLORE_HISTORY, else "
                       "$XDG_DATA_HOME/flyexplore/history)")


def run(a: argparse.Namespace) -> int:
    from flyexplore.results import history as H
    from flyexplore.results.history_store import Store

    store = Store(a.store)
    if a.action == "add":
        return _add(store, a)
    if a.action == "export":
        return _export(store, a, H)
    return _show(store, a, H)


def _add(store, a) -> int:
    added = store.add(a.files, progress=print)
    print(f"store {store.path}: {added.runs_added} new runs, {added.rows_added} rows added, "
          f"{added.rows_known} already there")
    return 0


def _export(store, a, H) -> int:
    from flyexplore.errors import bad_choice
    from flyexplore.results.table import check_writable

    if a.format not in H.EXPORT_FORMATS:
        raise bad_choice("--format", a.format, H.EXPORT_FORMATS)
    if a.out != "-":
        store.check_outside(a.out, "--out")
        check_writable(a.out, "export file")
    points = store.points(a.device)
    if points.empty and a.device:
        _no_device(store, a.device)
    data = H.export(points, a.format, a.run_id)
    text = json.dumps(data, indent=2, allow_nan=False) + "\n"
    if a.out == "-":
        sys.stdout.write(text)
    else:
        from flyexplore.atomic import write_text

        write_text(a.out, text)
        print(f"{a.format}: {len(data)} benchmarks -> {a.out}")
    return 0


def _show(store, a, H) -> int:
    from flyexplore.results.table import check_writable

    if a.top < 0:
        raise UsageError(f"bad --top {a.top}: a number of steps, 0 or more")
    if a.recent is not None and a.recent < 1:
        raise UsageError(f"bad --recent {a.recent}: a number of runs, 1 or more")
    if a.fail_on is not None:
        H.history_rules(a.fail_on)
    elif a.recent is not None:
        raise UsageError("--recent chooses the steps --fail-on gates on: give --fail-on SLOWER[:THRESHOLD] too")
    if a.json is not None and a.json != "-":
        store.check_outside(a.json, "--json")
        check_writable(a.json, "JSON file")
    if a.out is not None:
        from flyexplore.views.report import check_report_dir

        store.check_outside(a.out, "--out")
        check_report_dir(a.out)
        check_writable(a.out, "report folder", folder=True)
    points = store.points(a.device)
    if points.empty and a.device:
        _no_device(store, a.device)
    if points.empty:
        raise UsageError(f"history store {str(store.path)!r} has no runs")
    an = H.analyse(points, str(store.path))
    say = sys.stderr if a.json == "-" else sys.stdout
    failed, gate_lines = (H.gate_steps(an, a.fail_on, a.recent) if a.fail_on is not None else (False, []))
    if a.out is not None:
        from flyexplore.views.history import write_history_report

        static_note(a.no_images)
        print(f"report: {write_history_report(an, a.out, static=not a.no_images)}", file=say)
    for line in [*H.show_lines(an, a.top), *gate_lines]:
        print(line, file=say)
    if a.json is not None:
        d = H.show_dict(an)
        if a.fail_on is not None:
            d["gate"] = {"rule": a.fail_on, "failed": failed, "lines": gate_lines}
        text = json.dumps(d, indent=2, allow_nan=False) + "\n"
        if a.json == "-":
            sys.stdout.write(text)
        else:
            from flyexplore.atomic import write_text

            write_text(a.json, text)
    return EXIT_NO if failed else 0


def _no_device(store, device: str) -> None:
    devs = sorted(set(store.runs()["device"].dropna().astype(str)))
    raise UsageError(f"bad --device {device!r}: no run of that device (or device key) in the store "
                     f"(devices: {', '.join(devs) or 'none'})")
