"""Errors that flyexplore raises for bad input and for outputs it could not write.

:class:`UsageError` is the one error the command line turns into a single line on stderr and
exit code 2 (no traceback). Library callers can catch it like a ``ValueError``.
:class:`WriteError` (an ``OSError``: a full disk is no bad input) says which output file could not
be written and that it was left as it was; the command line prints it as one line too, exit 2.
"""
from __future__ import annotations

from typing import Iterable


class UsageError(ValueError):
    """A value given by the user is not valid here.

    The message names the bad value and, where there is a fixed set, the valid choices.
    """


class WriteError(OSError):
    """An output file could not be written (a full disk, a quota, a folder made read-only): the
    write was abandoned whole, so the file is as it was before (or, when new, not there).

    ``str()`` is one line naming the file, the OS's reason and what was left, e.g. ``cannot write
    report/report.html: [Errno 28] No space left on device (the old file is unchanged)``;
    ``errno`` and ``filename`` are the OS's. Raised by :mod:`flyexplore.atomic`, through which
    every output is written; the command line prints it as one line and exits with code 2.
    """

    def __init__(self, errno: int | None, strerror: str, filename: str, left: str = "the old file is unchanged"):
        super().__init__(errno, strerror, filename)
        self.left = left

    def __str__(self) -> str:
        why = f"[Errno {self.errno}] {self.strerror}" if self.errno is not None else self.strerror
        return " ".join(f"cannot write {self.filename}: {why} ({self.left})".split())


def bad_choice(what: str, value: object, choices: Iterable[str]) -> UsageError:
    """Build a :class:`UsageError` for ``value`` not being one of ``choices``.

    Example message: ``unknown backend 'foo' (valid: aten, triton, inductor, flydsl)``.
    """
    valid = ", ".join(str(c) for c in choices)
    return UsageError(f"unknown {what} {value!r} ({'valid: ' + valid if valid else 'there are none'})")
