"""Errors that flyexplore raises for bad input.

:class:`UsageError` is the one error the command line turns into a single line on stderr and
exit code 2 (no traceback). Library callers can catch it like a ``ValueError``.
"""
from __future__ import annotations

from typing import Iterable


class UsageError(ValueError):
    """A value given by the user is not valid here.

    The message names the bad value and, where there is a fixed set, the valid choices.
    """


def bad_choice(what: str, value: object, choices: Iterable[str]) -> UsageError:
    """Build a :class:`UsageError` for ``value`` not being one of ``choices``.

    Example message: ``unknown backend 'foo' (valid: aten, triton, inductor, flydsl)``.
    """
    valid = ", ".join(str(c) for c in choices)
    return UsageError(f"unknown {what} {value!r} ({'valid: ' + valid if valid else 'there are none'})")
