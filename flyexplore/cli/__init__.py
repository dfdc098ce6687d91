"""The ``flyexplore`` command line: thin wrappers over the library's functions, one module per
command (:data:`COMMANDS`), each with its options beside its handler (``add_arguments(parser)``,
``run(args) -> int``, ``HELP``); this module assembles the parser and handles what every command
shares: errors, interrupts, a closed pipe.

Bad input (unknown operator, suite, backend or dtype, malformed shapes, an output path that
cannot be written, a damaged or foreign result file) prints one line, ``flyexplore: error:
...``, and exits with code 2; so does an output that could not be written (a full disk:
:class:`~flyexplore.errors.WriteError`, ``cannot write F: [Errno 28] No space left on device (the
old file is unchanged)``; every output is written whole or not at all, :mod:`flyexplore.atomic`)
and any other ``OSError`` that reaches :func:`main` (its file and reason; ``FLYEXPLORE_DEBUG=1``
shows the traceback instead).
``--help`` and the name checks (:func:`flyexplore.cli._shared.catalogue`) answer without
importing torch or pandas (well under a second): a command module imports only light modules at
its top and its layer when it runs.

Exit codes (:mod:`flyexplore.cli._shared`): 0 success (``explain``: FlyDSL YES / AOTriton
eligible); 1 ``explain``: NO / not eligible (``xray``: the X-ray cannot run here; ``compare
--fail-on``: B is slower beyond the threshold; ``history show --fail-on``: a newest step is slower beyond
it); 2 usage error
(also a damaged input file, an unwritable output, a full disk: one line naming the file);
3 ``explain --op attention``: unverified (a condition cannot be evaluated away from the device);
4 ``sweep``: workers could not start, so some cases got ``crashed`` rows without running;
130 interrupted (Ctrl-C); a closed output pipe (``flyexplore explain ... | head``) ends quietly
with 141 (128 + SIGPIPE, what a shell reports for a program stopped by it).
"""
from __future__ import annotations

import argparse
import os
import sys

from flyexplore.cli import (compare, demo, env, explain, export, history, model, published, report, suites, sweep,
                            switches, trace, xray)
from flyexplore.cli._shared import EXIT_INTERRUPTED, EXIT_PIPE, EXIT_USAGE, dash_values, gpu_visible
from flyexplore.errors import UsageError, WriteError

#: The commands, in the order ``flyexplore --help`` lists them: name -> module.
COMMANDS = {"env": env, "suites": suites, "sweep": sweep, "explain": explain, "trace": trace,
            "switches": switches, "demo": demo, "xray": xray, "model": model, "published": published,
            "report": report, "compare": compare, "export": export, "history": history}


def quiet_cpu_noise() -> None:
    """On a machine without a GPU, silence two harmless messages torch prints there: Inductor's
    ``W... cpp_extension.py ... No CUDA runtime is found, using CUDA_HOME=...`` (the CUDA wheel
    looks for a CUDA toolkit it does not need on the CPU) and the profiler's (Kineto)
    ``gpuGetDeviceCount failed with code 35`` (CUDA error 35, insufficient driver: there is no
    GPU driver to ask), with the profiler's ``USDT: ... profiler_start`` / ``profiler_stop`` lines
    at each profiled call (issue 45). Neither affects a CPU result. Sets the profiler's quiet log
    level unless the user set one (:func:`flyexplore.measure.timing.quiet_profiler_log`; read when
    the profiler starts, so setting it here is in time), and the ``torch.utils.cpp_extension``
    logger to errors only."""
    if gpu_visible():
        return
    import logging

    from flyexplore.measure.timing import quiet_profiler_log

    quiet_profiler_log()
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kw):
        kw.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kw)

    def error(self, message):  # one line, no usage dump
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command (:data:`COMMANDS`): each subparser gets its module's ``HELP``,
    its ``add_arguments`` and, as ``args.run``, its ``run``."""
    p = _Parser(prog="flyexplore", description="Measure and explain PyTorch's FlyDSL, ATen, "
                "Triton and vendor paths (MI350 gfx950, any CUDA/ROCm GPU, or CPU).",
                epilog="flyexplore COMMAND --help lists a command's valid values (sweep --help: operators, "
                "backends, dtypes, suites, timing modes).\nexit codes: 0 ok (explain: FlyDSL YES), 1 explain: NO (compare --fail-on: B slower), "
                "2 usage error (or a damaged file, a full disk), 3 explain --op attention: unverified, 4 sweep: "
                "workers could not start (crashed rows written), 130 interrupted, 141 output pipe closed.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, mod in COMMANDS.items():
        c = sub.add_parser(name, help=mod.HELP)
        mod.add_arguments(c)
        c.set_defaults(run=mod.run)
    return p


def _pipe_closed() -> None:
    """The reader of stdout went away (``| head``): send what is left to /dev/null so that
    Python's exit flush raises nothing (the recipe in Python's ``signal`` documentation)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _close_browser() -> None:
    """Stop the kaleido browser a command started for static figures
    (:func:`flyexplore.views.export.close_kaleido_session`), so that it is gone before the
    interpreter's exit removes its temporary profile; nothing when none was started (nor is
    anything imported for it)."""
    ex = sys.modules.get("flyexplore.views.export")
    if ex is not None and ex.kaleido_session_open():
        ex.close_kaleido_session()


def _os_error_line(exc: OSError) -> str:
    """``<filename>: <strerror>`` of an ``OSError`` on one line (``a -> b`` for a rename); a
    :class:`~flyexplore.errors.WriteError` says it itself (``cannot write F: ... (the old file is
    unchanged)``)."""
    if isinstance(exc, WriteError):
        return str(exc)
    name = exc.filename if exc.filename2 is None else f"{exc.filename} -> {exc.filename2}"
    why = exc.strerror or str(exc)
    return " ".join((f"{name}: {why}" if name is not None else why).split())


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``flyexplore`` console script. Returns the exit code.

    A :class:`~flyexplore.errors.UsageError` prints ``flyexplore: error: <message>`` and returns
    2; so does, as a last net, an ``OSError`` no command turned into one (``flyexplore: error:
    <filename>: <strerror>``; with ``FLYEXPLORE_DEBUG`` set it is raised, traceback and all)."""
    try:
        p = build_parser()   # `--max-memory -5GB` reaches the option's own check (dash_values)
        a = p.parse_args(dash_values(p, sys.argv[1:] if argv is None else argv))
        quiet_cpu_noise()
        try:
            rc = a.run(a)
        finally:
            _close_browser()
        sys.stdout.flush()
    except UsageError as exc:
        print(f"flyexplore: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        _pipe_closed()
        return EXIT_PIPE
    except OSError as exc:   # after BrokenPipeError, which is one
        if os.environ.get("FLYEXPLORE_DEBUG"):
            raise
        print(f"flyexplore: error: {_os_error_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:   # sweep says more itself (which rows were kept)
        print("flyexplore: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return rc or 0


if __name__ == "__main__":
    sys.exit(main())
