"""``flyexplore compare``: an A/B of two result files paired by case, or of two
``vllm bench serve --save-result`` files or folders: a summary on the terminal
(:func:`flyexplore.results.compare.summary_lines`), with ``--out`` the A/B report
(:mod:`flyexplore.views.report`), with ``--json`` / ``--summary-md`` the summary as JSON or as
a GitHub Actions job summary, and with ``--fail-on`` a CI gate (exit 1 when B is slower beyond
a threshold, or an AMBIGUOUS interval is wider than a width; a ``:warn`` rule only warns;
:func:`flyexplore.results.gate.gate`)."""
from __future__ import annotations

import argparse
import sys

from flyexplore.atomic import append_text, write_text
from flyexplore.cli._shared import EXIT_NO, static_note
from flyexplore.errors import UsageError

HELP = ("A/B of two result files paired by case (or two vllm bench serve --save-result "
        "files/folders): a summary, a report (--out), JSON/Markdown for CI and a gate (--fail-on)")

DESCRIPTION = """\
Pairs two result files by (op, case, dtype, backend) and prints a summary: pairs per label
(FASTER: B faster, SAME, SLOWER: B slower, AMBIGUOUS), the geometric mean of time A / time B
with its 95% interval, the five largest changes and any difference between the two
environments. --out also writes the HTML report. One file of an environment A/B (flyexplore
sweep --env) compares its two environments (--a-env / --b-env pick two of three or more): the
arms were timed round by round in one run, so the intervals are paired, with no cross-run
allowance.

--fail-on takes one or more rules, comma-separated: SLOWER[:THRESHOLD] trips on a pair, or the
geometric mean, labelled SLOWER whose interval's upper end is below 1/(1+THRESHOLD);
AMBIGUOUS[:WIDTH] trips on one labelled AMBIGUOUS whose 95% interval is wider than WIDTH
(hi/lo - 1), and says how many pairs of workers would decide it (an environment A/B's spread
between pairs), or that a quieter machine or more rounds would; a rule ending in :warn only
warns (e.g. SLOWER:5%,AMBIGUOUS:5%:warn).

exit status: 0 done (gate passed, or only :warn rules tripped); 1 --fail-on tripped: a rule
without :warn tripped; 2 usage error (a bad --fail-on value, a damaged or missing file, an
unwritable output).

CI example (GitHub Actions):
  flyexplore compare main.parquet pr.parquet --names main,pr \\
      --fail-on SLOWER:5%,AMBIGUOUS:5%:warn --summary-md "$GITHUB_STEP_SUMMARY" --json ab.json
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = DESCRIPTION
    p.add_argument("a", help="side A (baseline): result file, or vllm JSON file/folder; alone, an environment "
                   "A/B file (sweep --env) whose two environments are the sides")
    p.add_argument("b", nargs="?", help="side B: result file, or vllm JSON file/folder")
    p.add_argument("--a-env", help="environment A/B file: the environment of side A (default: the A/B's base)")
    p.add_argument("--b-env", help="environment A/B file: the environment of side B (default: the other one; "
                   "needed where the file holds three or more)")
    p.add_argument("--out", help="also write the A/B report (report.html, tables, figures) into this folder "
                   "(default: no report, only the summary)")
    p.add_argument("--names", help="display names of A and B, comma-separated (default A,B)")
    p.add_argument("--a-backend", help="compare this backend of A ...")
    p.add_argument("--b-backend", help="... with this backend of B (e.g. aten vs flydsl of one sweep); "
                   "one of the two alone compares that backend on both sides")
    p.add_argument("--title")
    p.add_argument("--no-images", action="store_true", help="skip the PNG/SVG/PDF figure files")
    p.add_argument("--json", metavar="FILE", help="write the summary as JSON (counts, geometric mean, every "
                   "pair, warnings, the gate's outcome; NaN as null); - writes it to stdout and the "
                   "terminal summary to stderr")
    p.add_argument("--summary-md", metavar="FILE", help="append the summary as Markdown (counts table, "
                   "geometric mean, largest changes, warnings, the gate's outcome) to FILE, e.g. "
                   "\"$GITHUB_STEP_SUMMARY\" in GitHub Actions; the file is created if missing")
    p.add_argument("--history", metavar="DIR|off", help="the history store whose identical runs of the files' "
                   "one device give the cross-run allowance (flyexplore history; default: the default store, "
                   "$FLYEXPLORE_HISTORY, when it exists); off: the per-platform constant. The summary says which "
                   "applied")
    p.add_argument("--fail-on", metavar="RULE[,RULE...]", help="the CI gate, one or more comma-separated rules: "
                   "SLOWER[:THRESHOLD] exits 1 when any pair, or the geometric mean, is labelled SLOWER (B slower) "
                   "and its interval's upper end is below 1/(1+THRESHOLD): B slower by more than THRESHOLD even at "
                   "the favourable end; AMBIGUOUS[:WIDTH] exits 1 when one is labelled AMBIGUOUS and its interval "
                   "is wider than WIDTH (hi/lo - 1), saying how many pairs of workers would decide it; RULE:warn "
                   "only warns (exit 0). THRESHOLD, WIDTH: a percentage (5%%) or a fraction below 1 (0.05); "
                   "default 0, any SLOWER / AMBIGUOUS trips it. Example: SLOWER:5%%,AMBIGUOUS:5%%:warn")


def run(a: argparse.Namespace) -> int:
    # imported here, as in every command module: `flyexplore --help` imports neither torch nor pandas
    from flyexplore.results import compare as C
    from flyexplore.results import gate as G
    from flyexplore.results.aotriton_ab import summary_notes
    from flyexplore.results.table import check_writable

    # every value checked before any file is read or written
    names = tuple(n.strip() for n in a.names.split(",")) if a.names else None
    if names is not None and (len(names) != 2 or not all(names)):
        raise UsageError(f"--names needs two comma-separated names, got {a.names!r}")
    rule = G.parse_rules(a.fail_on) if a.fail_on is not None else None
    if a.json is not None and a.json != "-":
        check_writable(a.json, "JSON file")
    if a.summary_md is not None:
        check_writable(a.summary_md, "Markdown summary file")
    if a.out is not None:
        from flyexplore.views.report import check_report_dir

        check_report_dir(a.out)   # the output first: nothing is read or written for a folder that is refused
        check_writable(a.out, "report folder", folder=True)
    sd = C.sides(a.a, a.b, names, a.a_backend, a.b_backend, a.a_env, a.b_env,
                 history=a.history)   # files read with validation
    result = G.gate(sd, rule) if rule is not None else None   # a vllm A/B refused here, before writing
    # with --json -, stdout carries the JSON alone
    say = sys.stderr if a.json == "-" else sys.stdout
    if a.out is not None:
        from flyexplore.views.report import write_ab_report

        static_note(a.no_images)
        path = write_ab_report(sd, a.out, title=a.title, static=not a.no_images)
        print(f"report: {path}", file=say)
    notes = summary_notes(sd)   # the published AOTriton range: shown or why not
    for line in C.summary_lines(sd, result, notes=notes):
        print(line, file=say)
    if a.json is not None:
        _write_json(C.summary_dict(sd, result, notes=notes), a.json)
    if a.summary_md is not None:
        _append(a.summary_md, C.summary_markdown(sd, result, notes=notes))
    return EXIT_NO if result is not None and result.failed else 0


def _write_json(d: dict, where: str) -> None:
    """Write the JSON summary to the file ``where`` whole or not at all (:mod:`flyexplore.atomic`),
    or to stdout for ``-``."""
    import json

    text = json.dumps(d, indent=2, allow_nan=False) + "\n"
    if where == "-":
        sys.stdout.write(text)
        return
    write_text(where, text)


def _append(where: str, text: str) -> None:
    """Append ``text`` to the file ``where`` (created if missing), a blank line before it when
    the file already holds text (GitHub's convention for ``$GITHUB_STEP_SUMMARY``): all of it or,
    when the write fails (a full disk), none (:func:`flyexplore.atomic.append_text`)."""
    import os

    gap = "\n" if os.path.isfile(where) and os.path.getsize(where) > 0 else ""
    append_text(where, gap + text)
