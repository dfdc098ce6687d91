"""The kernel X-ray's disk cache: what the compile-only worker (``_xray_worker.py``) returned for
one case, kept so that the same X-ray again (the inspector's X-ray button, a notebook run twice, a
batch that repeats a case) reads it instead of starting the worker (about 3 CPU-s to import torch
and flydsl, plus the compile, on a 2-core x86 machine).

An entry is the worker's record of one job (verdict, notes, each kernel's family, config, flydsl's
compile time in seconds, and the text of each final ISA file), in flyexplore's disk cache
(:mod:`flyexplore.cache`, kind ``xray``: ``$FLYEXPLORE_CACHE/xray``, else
``~/.cache/flyexplore/xray``; ``FLYEXPLORE_CACHE=off`` turns it off). Its key is everything the
compile depends on (:func:`toolchain`, :func:`entry_key`): the target arch, the job (builder,
shape parameters, dtype, autotune, the verdict asked for), the installed torch and flydsl
versions, the AMDGPU linker and device libraries used (path, size, modification time), and the
source of the worker, the builder's module and ``flyexplore.ops.xray_kit`` -- so a new torch, a
new flydsl, another linker or an edited builder compiles afresh. Only whole, error-free records
are kept. A damaged or unreadable entry is ignored; a cache that cannot be written is skipped.

Numbers read from the cache are still compiler output for the target (``source = "compiled"``):
each kernel says ``cached`` (:class:`flyexplore.insight.xray.XRayKernel`).
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
from typing import Any

from flyexplore import cache as disk_cache

#: Bumped when an entry's layout changes (older entries are then never read).
CACHE_VERSION = 1


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _file_id(path: str | None) -> str:
    """``path``, its size and modification time (``"none"`` without a path)."""
    if not path:
        return "none"
    try:
        st = os.stat(path)
    except OSError:
        return f"{path} (missing)"
    return f"{path} {st.st_size} {st.st_mtime_ns}"


def _source_digest(module: str) -> str:
    """sha256 of module ``module``'s source file, found without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    origin = getattr(spec, "origin", None)
    if not origin or not os.path.isfile(origin):
        return f"{module}: no source"
    with open(origin, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def toolchain(lld_path: str | None, device_libs: str | None) -> dict[str, str]:
    """What every X-ray compile here depends on besides its job: torch's and flydsl's installed
    versions, the linker and the device libraries (path, size, modification time) and the
    worker's source (sha256)."""
    return {"torch": _version("torch"), "flydsl": _version("flydsl"), "lld": _file_id(lld_path),
            "device_libs": _file_id(device_libs), "worker": _source_digest("flyexplore.insight._xray_worker"),
            "xray_kit": _source_digest("flyexplore.ops.xray_kit")}


def entry_key(arch: str, job: dict[str, Any], tools: dict[str, str]) -> str:
    """The key of one job's entry: ``arch``, the job as the worker gets it, ``tools``
    (:func:`toolchain`) and the source of the job's builder module (sha256)."""
    module = str(job.get("builder", "")).partition(":")[0]
    text = json.dumps({"v": CACHE_VERSION, "arch": arch, "job": job, "tools": tools,
                       "builder_source": _source_digest(module) if module else "none"},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def cacheable(res: dict[str, Any]) -> bool:
    """Whether a worker record is worth keeping: eligible, no error, each kernel built with its
    ISA files."""
    kernels = res.get("kernels") or []
    return (bool(res.get("eligible")) and not res.get("error") and bool(kernels)
            and all(not k.get("error") and k.get("isa") for k in kernels))


def store(key: str, res: dict[str, Any], versions: dict[str, str]) -> bool:
    """Keep the worker record ``res`` (its ISA files read into the entry) and the worker's
    ``versions`` under ``key``. Returns whether it was written (not: no cache, a record not
    :func:`cacheable`, an ISA file gone, or the cache not writable)."""
    if disk_cache.entry_path("xray", key) is None or not cacheable(res):
        return False
    try:
        kernels = []
        for k in res["kernels"]:
            isa = []
            for p in k["isa"]:
                with open(p, encoding="utf-8") as f:
                    isa.append({"name": os.path.basename(p), "text": f.read()})
            kernels.append({**{a: b for a, b in k.items() if a not in ("isa", "dump_dir", "traceback")}, "isa": isa})
        entry = {"v": CACHE_VERSION, "versions": versions, "result": {**res, "kernels": kernels}}
        return disk_cache.write_entry("xray", key, entry)
    except (OSError, TypeError, ValueError):
        return False


def load(key: str, scratch: str) -> tuple[dict[str, Any], dict[str, str]] | None:
    """The entry of ``key`` as the worker would have returned it -- ``(record, versions)``, each
    kernel's ISA texts written back into files under ``scratch`` (``isa``: their paths) and
    marked ``cached`` -- or ``None`` (no cache, no entry, a damaged one)."""
    entry = disk_cache.read_entry("xray", key)
    if entry is None:
        return None
    try:
        if entry.get("v") != CACHE_VERSION:
            return None
        res = dict(entry["result"])
        kernels = []
        for j, k in enumerate(res["kernels"]):
            folder = os.path.join(scratch, "cached", f"{key[:16]}_{j:03d}")
            os.makedirs(folder, exist_ok=True)
            paths = []
            for isa in k["isa"]:
                p = os.path.join(folder, os.path.basename(str(isa["name"])))
                with open(p, "w", encoding="utf-8") as f:
                    f.write(str(isa["text"]))
                paths.append(p)
            kernels.append({**k, "isa": paths, "cached": True, "reused": False})
        res["kernels"] = kernels
        return res, dict(entry.get("versions") or {})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
