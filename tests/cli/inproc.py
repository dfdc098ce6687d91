"""The command line in this process (issue 47): :func:`flyexplore.cli.main` called with ``argv``
as ``python -m flyexplore ARGS`` would get them, its output read back with pytest's ``capsys``.
No interpreter start and no torch import per call (3-5 CPU-s each on the test machine).

:func:`run_main` ``(capsys, *args, cwd=None, env=None)`` is shaped like conftest's ``run_cli``: it
gives an object with ``returncode``, ``stdout`` and ``stderr`` (text), so a test asserts what it
asserted of the subprocess. ``cwd`` (default: the repository, as ``run_cli``) and ``env``
(variables set for the call) hold for the call only. Pass ``capfd`` instead of ``capsys`` where
what matters is printed by C code or a child process (the browser) to the file descriptors.

What :func:`main` changes in the process is put back after each call, so that no test sees what an
earlier one's command left. Found by comparing the process before and after ``env``, ``explain``,
``sweep``, ``model`` and ``export``: ``KINETO_LOG_LEVEL`` set in ``os.environ``
(``quiet_cpu_noise`` on a machine without a GPU; a later subprocess inheriting it would be
silenced by the variable, not by the command line), the levels of the ``torch.utils.cpp_extension``
logger (``quiet_cpu_noise``) and of ``torch.utils._pytree`` (``model``, before importing
transformers), and ``TORCHINDUCTOR_CACHE_DIR`` (torch sets it whenever Inductor asks for its cache
folder, so removing it is harmless). Torch's thread count, the signal handlers and the working
directory came back unchanged (``sweep`` restores its own); the helper restores them anyway, as a
net, with every other environment variable. Warning filters added by imports are left: pytest
restores them after each test. Keep a real subprocess where a fresh process is the point:
``--help`` without torch, Ctrl-C and SIGTERM, a full disk, what is read once per process (Kineto's
log level) or printed at interpreter exit.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Loggers whose level a command sets: ``quiet_cpu_noise`` and ``model`` (before transformers).
LOGGERS = ("torch.utils.cpp_extension", "torch.utils._pytree")
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass
class Ran:
    """What one in-process command gave: its exit code and what it printed (text)."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def _threads():
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None


def run_main(capsys, *args, cwd=None, env=None) -> Ran:
    """Run ``flyexplore ARGS`` in this process (:func:`flyexplore.cli.main`) in ``cwd`` (default:
    the repository) with ``env`` added to the environment; returns its :class:`Ran`. A
    ``SystemExit`` (``--help``) is its exit code, as in a process. The process state that
    ``main`` may change is restored afterwards (module docstring)."""
    from flyexplore.cli import main

    args = [str(a) for a in args]
    capsys.readouterr()                       # what the test printed before is not this command's
    environ = dict(os.environ)
    here = os.getcwd()
    levels = {n: logging.getLogger(n).level for n in LOGGERS}
    handlers = {s: signal.getsignal(s) for s in _SIGNALS}
    threads = _threads()
    os.environ.update({k: str(v) for k, v in (env or {}).items()})
    os.chdir(cwd or ROOT)
    try:
        try:
            rc = main(args)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        out, err = capsys.readouterr()
    finally:
        os.chdir(here)
        for k in set(os.environ) - set(environ):
            del os.environ[k]
        os.environ.update({k: v for k, v in environ.items() if os.environ.get(k) != v})
        for n, lv in levels.items():
            logging.getLogger(n).setLevel(lv)
        for s, h in handlers.items():
            if h is not None and signal.getsignal(s) is not h:
                signal.signal(s, h)
        if threads is not None and _threads() != threads:
            sys.modules["torch"].set_num_threads(threads)
    return Ran(args, rc, out, err)

