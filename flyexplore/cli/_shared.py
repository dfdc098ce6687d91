"""What the commands of :mod:`flyexplore.cli` share: the exit codes, the catalogue's names as
the command line checks them (without torch: :mod:`flyexplore.ops` imports none), and the
helpers of the commands that write reports.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flyexplore.errors import UsageError, bad_choice
from flyexplore.ops import get_op, list_ops

# The helpers below import their layer when they run, as every command module does, so that
# `flyexplore --help` imports neither torch nor pandas.

#: Exit codes (documented in :mod:`flyexplore.cli` and docs/index.md): 0 success (``explain``: FlyDSL
#: YES / AOTriton eligible), 1 ``explain``: NO / not eligible (``xray``: cannot run here;
#: ``compare --fail-on``: the gate tripped, B slower beyond the threshold),
#: 2 usage error (also: a damaged input file, a full disk), 3 ``explain --op attention``:
#: unverified, 4 ``sweep``: workers could not start, so some cases got ``crashed`` rows without
#: running (every row written), 130 interrupted, 141 closed pipe, 143 ``sweep`` stopped by SIGTERM
#: (its finished rows kept, as after Ctrl-C).
EXIT_YES, EXIT_NO, EXIT_USAGE, EXIT_UNVERIFIED, EXIT_INTERRUPTED, EXIT_PIPE = 0, 1, 2, 3, 130, 141
EXIT_INCOMPLETE, EXIT_TERMINATED = 4, 143


def catalogue() -> dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]]:
    """What the command line accepts, per operator: ``{op: (backends, dtypes, suites)}`` in the
    catalogue's order, read from the registry (:mod:`flyexplore.ops`, which imports no torch,
    so ``--help`` and name errors stay fast), operators added by ``register_op`` included."""
    out = {}
    for n in list_ops():
        op = get_op(n)
        out[n] = (tuple(op.backends), tuple(op.dtypes), tuple(op.suites))
    return out


def explain_ops() -> tuple[str, ...]:
    """Operators ``explain`` answers for (:func:`flyexplore.insight.explain.explainable`, attention included)."""
    from flyexplore.insight.explain import explainable
    return tuple(explainable(True))


def values_text(only: str | None = None) -> str:
    """The valid values of :func:`catalogue` as help text, one block per operator."""
    lines = ["operators, with their backends, dtypes (first: the default for --shapes on a GPU; "
             "fp32 on the CPU when the operator has it) and suites:"]
    for op, (bk, dt, su) in catalogue().items():
        if only and op != only:
            continue
        lines.append(f"  {op}")
        lines.append(f"    backends: {', '.join(bk)}")
        lines.append(f"    dtypes:   {', '.join(dt)}")
        lines.append(f"    suites:   {', '.join(su)}")
    return "\n".join(lines)


def check_names(op: str | None, backends: str | None = None, dtypes: str | None = None,
                suite: str | None = None, what: str = "operator") -> None:
    """Check names against :func:`catalogue` (no torch), with the library's messages. An
    operator given as ``module:attribute`` (an Operator outside the catalogue, see
    :func:`flyexplore.run.plan.resolve_op`) is checked later, when it is imported."""
    if op is None or ":" in op:
        return
    cat = catalogue()
    if op not in cat:
        raise bad_choice(what, op, cat)
    bk, dt, su = cat[op]
    for b in (backends or "").split(","):
        if b.strip() and b.strip() not in bk:
            raise bad_choice(f"backend for {op}", b.strip(), bk)
    for d in (dtypes or "").split(","):
        if d.strip() and d.strip() not in dt:
            raise bad_choice(f"dtype for {op}", d.strip(), dt)
    if suite is not None and suite not in su:
        raise bad_choice(f"suite for {op}", suite, su)


def gpu_visible() -> bool:
    """Whether this machine shows a GPU device node (NVIDIA or AMD KFD), without torch."""
    return Path("/dev/kfd").exists() or any(Path("/dev").glob("nvidia[0-9]*"))


def baseline_arg(text: str):
    """``--baseline`` text: one backend, or several comma-separated (a list: the faster of them
    per case). Raises :class:`UsageError` for an empty text."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise UsageError(f"empty --baseline {text!r} (e.g. aten, or aten,triton for the faster of both)")
    return parts[0] if len(parts) == 1 else parts


def static_note(no_images: bool) -> None:
    """Say on stderr when static figure files will be skipped (the report says it too)."""
    if not no_images:
        from flyexplore.views.export import static_export_problem

        why = static_export_problem()
        if why:
            print(f"flyexplore: note: PNG/SVG/PDF figures skipped: {why}", file=sys.stderr)


def inputs_in(paths, folder) -> list[str]:
    """Names of the input files that lie directly in ``folder`` (kept beside a report there)."""
    f = Path(folder).resolve()
    return [Path(p).name for p in paths if Path(p).resolve().parent == f]


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """A parser's option strings -> their actions (every group's)."""
    return {o: act for act in parser._actions for o in act.option_strings}


def _option_named(opts: dict[str, argparse.Action], tok: str) -> argparse.Action | None:
    """The action ``tok`` names as argparse reads it: an option string, or the unique ``--`` option
    it abbreviates (argparse's ``allow_abbrev``); None otherwise."""
    if tok in opts:
        return opts[tok]
    if tok.startswith("--") and len(tok) > 2:
        hits = {id(a): a for o, a in opts.items() if o.startswith(tok)}
        if len(hits) == 1:
            return next(iter(hits.values()))
    return None


def dash_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``argv`` with ``--opt -value`` written ``--opt=-value`` wherever ``--opt`` takes one value and
    ``-value`` is no option of the command: argparse reads a word that starts with ``-`` (and is
    not a plain negative number) as an option and says ``expected one argument``, so the option's
    own check never saw ``--max-memory -5GB`` (issue 45). A word that names an option (``--out
    --quiet``: a value forgotten) or is ``-`` alone is left as it is, as is everything after
    ``--``. Options are those of the command (``parser``'s subcommand named in ``argv``), else the
    parser's own."""
    argv = [str(x) for x in argv]
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    opts, out, i, chosen = _options(parser), [], 0, False
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            out.extend(argv[i:])
            break
        if not chosen and subs and not tok.startswith("-") and tok in subs[0].choices:
            opts, chosen = _options(subs[0].choices[tok]), True
            out.append(tok)
            i += 1
            continue
        act = _option_named(opts, tok) if tok.startswith("-") and "=" not in tok else None
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if (act is not None and act.nargs is None and tok.startswith("--") and nxt is not None
                and nxt.startswith("-") and nxt != "-" and _option_named(opts, nxt.split("=", 1)[0]) is None):
            out.append(f"{tok}={nxt}")
            i += 2
            continue
        out.append(tok)
        i += 1
    return out


def stopped_line(out: str | Path, how: str = "interrupted") -> str:
    """What a command that journals its rows into ``out`` (``sweep``, ``model --measure --out``)
    says when Ctrl-C (``how="interrupted"``) or SIGTERM (``"terminated"``) stopped it: where the
    finished rows are kept and that ``--resume`` goes on from them, or that nothing was written.
    Both commands take ``--resume`` and ``--overwrite``."""
    from flyexplore.run.journal import journal_path

    jp = journal_path(out)
    if jp.exists() or Path(out).exists():
        kept = f"the journal {str(jp)!r} (the result file was not written)" if jp.exists() else str(out)
        return (f"flyexplore: {how}; finished rows kept in {kept}; to continue, re-run the same command with "
                "--resume (--overwrite starts again)")
    return (f"flyexplore: {how} before any case finished; nothing was written to {out}; re-run the same command "
            "to start again")
