"""The arms of an environment A/B, and the baseline rows are compared against by default.

An environment A/B (``flyexplore sweep --env``) times backends in several environments; its rows
keep each arm's name, ``backend@env`` (:data:`ARM_SEP`), in ``backend`` and the environment in
``env`` (:data:`flyexplore.results.table.COLUMNS`). :func:`arm_name` and :func:`split_arm` write
and read the names, :func:`ab_envs` lists the environments of rows, and :func:`default_baseline`
is the backend (or arm) speedups are taken against when none is named. Re-exported by
:mod:`flyexplore.results.table` (``R.arm_name``, ``R.split_arm``, ...).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from flyexplore.errors import UsageError
from flyexplore.ops import get_op

if TYPE_CHECKING:   # the names only: a sweep's worker names its arms without importing pandas
    import pandas as pd

#: Between a backend and its environment in an arm's name: ``flash@0.14.2b`` (an environment A/B's
#: rows keep it in ``backend``, so that every rule keyed by backend tells the arms apart).
ARM_SEP = "@"


def arm_name(backend: str, env: str | None) -> str:
    """``backend@env`` (an arm of an environment A/B); ``backend`` when ``env`` is None."""
    return backend if env is None else f"{backend}{ARM_SEP}{env}"


def ab_envs(df: pd.DataFrame) -> list[str]:
    """The environments of an environment A/B's rows (column ``env``), in order of first
    appearance; ``[]`` for other rows."""
    if "env" not in df:
        return []
    return [str(e) for e in df["env"].dropna().unique()]


def default_baseline(df: pd.DataFrame) -> str:
    """The backend speedups are taken against when none is named: an environment A/B's baseline
    arm (its rows' own: the arm whose ``baseline`` is itself); else the baseline backend of the
    rows' operators where they share one (``aten`` for the kernel families, ``eager`` for the model
    family, :attr:`flyexplore.ops.base.Backend.baseline`); else ``aten``."""
    if ab_envs(df) and "baseline" in df:
        d = df[df["env"].notna() & df["baseline"].notna()]
        own = d.loc[d["baseline"] == d["backend"], "baseline"]
        got = own if len(own) else d["baseline"]
        if len(got):
            return str(got.value_counts().index[0])
    if "op" in df and len(df):
        names: set[str] = set()
        for op in df["op"].dropna().unique():
            try:
                names |= {n for n, b in get_op(str(op)).backends.items() if b.baseline} or {"aten"}
            except UsageError:   # an operator this catalogue does not hold (another plug-in's)
                names.add("aten")
        if len(names) == 1:
            return names.pop()
    return "aten"


def split_arm(name) -> tuple[str, str | None]:
    """``(backend, env)`` of an arm's name (``"flash@0.14.2b"`` -> ``("flash", "0.14.2b")``);
    ``(name, None)`` for a plain backend."""
    b, sep, e = str(name).partition(ARM_SEP)
    return (b, e) if sep and e else (str(name), None)
