"""flyexplore's disk cache of what it can make again: one JSON file per entry, under
``<cache_dir>/<kind>/`` (:func:`flyexplore.paths.cache_dir`: ``$FLYEXPLORE_CACHE``, else
``~/.cache/flyexplore``; ``FLYEXPLORE_CACHE=off``: no disk cache). The memory estimate's fits
(:mod:`flyexplore.run.memory`, kind ``memory``) and the kernel X-ray's compiles
(:mod:`flyexplore.insight.xray_cache`, kind ``xray``) are kept here.

An entry is written whole or not at all (:func:`flyexplore.atomic.write_text`: a reader sees the
old file or the new one); a cache that cannot be written (a full disk, a read-only home) is
skipped, and an entry that cannot be read or parsed is read as none -- the owner makes it again.
What an entry holds, and whether it is the one asked for, the owner checks.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any

from flyexplore import atomic
from flyexplore.paths import cache_dir


def entry_path(kind: str, key: str) -> Path | None:
    """The file of entry ``key`` of ``kind`` (``<cache_dir>/<kind>/<first 24 hex digits of
    sha256(key)>.json``), or ``None`` where the disk cache is off."""
    d = cache_dir()
    return None if d is None else d / kind / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")


def read_entry(kind: str, key: str) -> Any | None:
    """The parsed JSON of entry ``key`` of ``kind``; ``None`` without a disk cache, without the
    entry, or for one that cannot be read or parsed."""
    path = entry_path(kind, key)
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_entry(kind: str, key: str, obj: Any) -> bool:
    """Write ``obj`` (JSON-serialisable) as entry ``key`` of ``kind``, whole or not at all.
    Returns whether it was written (not: no disk cache, or a cache that cannot be written)."""
    path = entry_path(kind, key)
    if path is None:
        return False
    text = json.dumps(obj)
    with contextlib.suppress(OSError):   # WriteError is an OSError
        atomic.write_text(path, text)
        return True
    return False
