"""Where flyexplore's data lives: ``data/`` at the top of the repository (published MI355X
figures under ``data/published/``, committed measurements beside them). Override with the
``FLYEXPLORE_DATA`` environment variable. flyexplore is installed editable (``pip install -e``),
so the folder is found next to the package.
"""
from __future__ import annotations

import os
from pathlib import Path


def repo_dir() -> Path:
    """The checkout holding the ``flyexplore`` package (its ``data/``, ``notebooks/``)."""
    return Path(__file__).resolve().parents[1]


def data_dir() -> Path:
    """The data folder (``$FLYEXPLORE_DATA`` or ``<repo>/data``)."""
    return Path(os.environ.get("FLYEXPLORE_DATA") or repo_dir() / "data")


def published_dir() -> Path:
    """``data/published``: the per-case MI355X figures and their ``SOURCES.md``."""
    return data_dir() / "published"


def model_shapes_dir() -> Path:
    """``data/models/shapes``: the calls of the built-in models exported by ``fx.model(...).shapes()``
    (``flyexplore model --export-shapes``), read by the ``hf-*`` suites."""
    return data_dir() / "models" / "shapes"


def cache_dir() -> Path | None:
    """Where flyexplore keeps what it can make again (:mod:`flyexplore.cache`: the memory
    estimate's fits, the kernel X-ray's compiles): ``$FLYEXPLORE_CACHE``, else ``$XDG_CACHE_HOME/flyexplore``, else
    ``~/.cache/flyexplore``; None (no disk cache) when ``FLYEXPLORE_CACHE`` is ``off``."""
    env = os.environ.get("FLYEXPLORE_CACHE")
    if env is not None and env.strip().lower() in ("off", "0", "none", "no", "false"):
        return None
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flyexplore"
