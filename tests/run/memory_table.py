"""One process that measures, for many CPU (family, backend) pairs, the memory estimate and the
peak the checked case really reaches -- for ``tests/run/test_memory.py``, which starts it once
(``python -m tests.run.memory_table``, the pairs as JSON on stdin) and reads one line per pair.

Every measurement is what the test made before, one pair at a time: the estimate of
:func:`flyexplore.run.memory.estimate_cases` (its probes measured and fitted here, into an empty
cache) and the checked case's peak from :func:`flyexplore.run.memory.measure_cases`
(``fresh=True``, the allocator and Inductor's caches as a sweep has them). Each probe child those
start is still a fresh process that has run no case -- but a fork of this one
(:class:`ForkedChild`, put in :data:`flyexplore.run.memory.start_probe_child`), not a new
interpreter: torch, flyexplore and the environment are imported and read once here (about 5 CPU-s
a child on the 2-core machine, three children a pair), not in every child. The probe child
itself (:func:`flyexplore.run.memprobe.main`) runs unchanged in the fork, its peak read the same
way (``VmHWM`` growth after ``clear_refs``); what a new interpreter would read from its
environment at its start is set in the fork instead: glibc's mmap and trim thresholds
(``MALLOC_MMAP_THRESHOLD_``, :func:`_as_exec`) and Inductor's ``force_disable_caches``
(``TORCHINDUCTOR_FORCE_DISABLE_CACHES``); and the library pages the imports mapped here are mapped
in the fork before it measures (:func:`map_again`: a fork does not inherit them, and its first
case would count them as its own -- 17 MB more for a compiled GEMM probe, 147 MB in a new
interpreter). A child asked for any other change of environment is refused
(:class:`ForkedChild`), so that a new variable in ``measure_cases`` is not silently lost.

Checked against new interpreters on the 2-core machine (``measure_cases`` of one case, each way
in turn): a compiled GEMM probe (inductor, 1024x512x512 fp32, tidy) 147.1-147.4 MB both ways; the
checked GEMMs (2048x1024x1024 fp32, as a sweep has it) aten 335-394 MB new, 335-369 MB forked,
inductor 412-428 MB new, 410-485 MB forked (a first case's peak in a fresh process moves by tens
of MB from one process to the next either way); the probes of a fit the same to 0.1 MB.

This process itself runs no case: it only forks, fits and reads.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
import traceback

#: The prefix of this process's result lines on stdout.
MARK = "memory-table "
#: The variables measure_cases sets for a probe child that a fork reads at its start (below); PYTHONPATH
#: only matters to a new interpreter (the fork has the modules already).
HANDLED = {"MALLOC_MMAP_THRESHOLD_", "TORCHINDUCTOR_FORCE_DISABLE_CACHES", "PYTHONPATH"}
#: glibc's mallopt parameters and its default trim threshold (malloc/malloc.h, malloc.c).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, DEFAULT_TRIM_THRESHOLD = -1, -3, 128 * 1024
#: madvise's "map these pages now, as a read would" (linux/mman.h, Linux >= 5.14).
MADV_POPULATE_READ = 22


def _as_exec(env: dict) -> None:
    """In the fork: what a new interpreter started with ``env`` would have set at its start."""
    if "MALLOC_MMAP_THRESHOLD_" in env:
        # glibc reads the variable at start: a fixed mmap threshold, the trim threshold at its
        # default (this process's dynamic threshold may have raised both)
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        if not (libc.mallopt(M_MMAP_THRESHOLD, int(env["MALLOC_MMAP_THRESHOLD_"]))
                and libc.mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)):
            raise OSError("mallopt refused the thresholds")
    import torch.compiler.config

    torch.compiler.config.force_disable_caches = env.get("TORCHINDUCTOR_FORCE_DISABLE_CACHES") == "1"


def mapped_file_pages() -> list[tuple[int, int]]:
    """``(address, bytes)`` runs of the pages of this process's readable file mappings (shared
    libraries' code and data) that are in its page table now (the present bit of
    ``/proc/self/pagemap``). A fork does not copy those entries (it maps them again at the first
    touch): without :func:`map_again` its first case would count as its own every library page
    that the imports here had touched."""
    import numpy as np

    page = os.sysconf("SC_PAGE_SIZE")
    runs = []
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps, open("/proc/self/pagemap", "rb") as pm:
        for line in maps:
            parts = line.split(maxsplit=5)
            if len(parts) < 6 or not parts[5].startswith("/") or parts[5].startswith("/dev/") or "r" not in parts[1]:
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            pm.seek(lo // page * 8)
            present = (np.frombuffer(pm.read((hi - lo) // page * 8), dtype=np.uint64) >> np.uint64(63)).astype(np.int8)
            edges = np.flatnonzero(np.diff(np.concatenate(([0], present, [0]))))
            runs += [(lo + int(a) * page, int(b - a) * page) for a, b in zip(edges[::2], edges[1::2])]
    return runs


def map_again(runs: list[tuple[int, int]]) -> None:
    """Map ``runs`` (:func:`mapped_file_pages` of the process forked from) into this one's page table:
    ``madvise(MADV_POPULATE_READ)`` (Linux >= 5.14), else a read of a byte per page."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    page = os.sysconf("SC_PAGE_SIZE")
    for addr, size in runs:
        if libc.madvise(addr, size, MADV_POPULATE_READ) != 0:
            for a in range(addr, addr + size, page):
                ctypes.string_at(a, 1)


def _child(env: dict, pipes: list[tuple[int, int]], runs: list[tuple[int, int]]) -> None:
    """The fork's side: the probe child's main on ``pipes`` (stdin's, stdout's, stderr's ``(read,
    write)``), then exit."""
    code = 1
    try:
        os.setsid()
        map_again(runs)
        for fd, std in zip((pipes[0][0], pipes[1][1], pipes[2][1]), (0, 1, 2)):
            os.dup2(fd, std)
        for fd in (fd for pipe in pipes for fd in pipe):
            os.close(fd)
        os.environ.clear()
        os.environ.update(env)
        sys.stdin = open(0, encoding="utf-8", closefd=False)
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False)
        _as_exec(env)
        from flyexplore.run import memprobe

        code = memprobe.main()
        if "torch._inductor.async_compile" in sys.modules:   # as the interpreter's exit would
            sys.modules["torch._inductor.async_compile"].shutdown_compile_workers()
    except BaseException:  # noqa: BLE001 - said on the child's stderr, as a new interpreter would
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)   # never this process's own exit handlers


class ForkedChild:
    """A probe child forked from this process: the part of :class:`subprocess.Popen` that
    :func:`flyexplore.run.memory.measure_cases` uses (``pid``, ``returncode``,
    ``communicate(input, timeout)``, ``wait()``), text pipes, a session of its own. Raises
    ``ValueError`` for an environment that differs from this process's other than in
    :data:`HANDLED`."""

    def __init__(self, env: dict):
        odd = sorted(k for k in set(env) | set(os.environ) if env.get(k) != os.environ.get(k) and k not in HANDLED)
        if odd:
            raise ValueError(f"a forked probe child cannot take these variables: {odd}")
        runs = mapped_file_pages()
        pipes = [os.pipe() for _ in range(3)]
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(env, pipes, runs)
        self.pid, self.returncode = pid, None
        for fd in (pipes[0][0], pipes[1][1], pipes[2][1]):
            os.close(fd)
        self._in, self._outs = pipes[0][1], {pipes[1][0]: bytearray(), pipes[2][0]: bytearray()}
        self._order, self._open = [pipes[1][0], pipes[2][0]], {pipes[1][0], pipes[2][0]}
        self._input_sent = False

    def communicate(self, input: str | None = None, timeout: float | None = None) -> tuple[str, str]:
        """Write ``input`` (once), read stdout and stderr to their end, wait for the exit; raises
        :class:`subprocess.TimeoutExpired` past ``timeout`` s (what was read is kept for the next call)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._input_sent:
            self._input_sent = True
            data = (input or "").encode()
            try:
                while data:   # a request is a few kB: the pipe takes it whole before the child reads
                    data = data[os.write(self._in, data):]
            except BrokenPipeError:
                pass
            os.close(self._in)
        with selectors.DefaultSelector() as sel:
            for fd in self._open:
                sel.register(fd, selectors.EVENT_READ)
            while sel.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired("forked probe child", timeout)
                for key, _ in sel.select(left):
                    chunk = os.read(key.fd, 1 << 16)
                    if chunk:
                        self._outs[key.fd] += chunk
                    else:
                        sel.unregister(key.fd)
                        os.close(key.fd)
                        self._open.discard(key.fd)
        self.wait()
        out, err = (bytes(self._outs[fd]).decode("utf-8", "replace") for fd in self._order)
        return out, err

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def measure(pairs) -> None:
    """For each ``[family, backend, dtype, structure, declared bytes]`` of ``pairs``: the case of
    that structure resized to those bytes (:func:`flyexplore.run.memory.resize`), its estimate
    (:func:`flyexplore.run.memory.estimate_cases`, fitted here) and its peak measured alone in a
    fresh process (:func:`flyexplore.run.memory.measure_cases`, ``fresh=True``); one line on
    stdout each, as it ends (:data:`MARK` and JSON: ``family``, ``backend``, ``dtype``, ``case``,
    ``estimate`` bytes or None, ``notes``, ``status``, ``peak`` bytes or None, ``message``,
    ``seconds``)."""
    import importlib

    from flyexplore.ops import get_op
    from flyexplore.run import memory as M
    from flyexplore.world import env as ENV

    importlib.import_module("flyexplore.run.memprobe")   # what the probe child imports, once here

    ENV.collect()   # the probe child's first step, done once here (cached for the forks)
    M.start_probe_child = ForkedChild
    for fam, backend, dtype, structure, target in pairs:
        t0 = time.monotonic()
        op = get_op(fam)
        case = M.resize(op, op.case(structure), dtype, target)
        est, notes = M.estimate_cases(op, [(case, dtype)], [backend], "cpu")
        (got,) = M.measure_cases(op, [(case, dtype, (backend,))], "cpu", tidy_malloc=False, fresh=True)
        e = est.get((case.label, dtype))
        row = {"family": fam, "backend": backend, "dtype": dtype, "case": case.label,
               "estimate": None if e is None else e.total, "notes": notes, "status": got["status"],
               "peak": got["peak"], "message": got["message"], "seconds": round(time.monotonic() - t0, 1)}
        sys.stdout.write(MARK + json.dumps(row) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="flyexplore-memory-table-") as cache:
        os.environ["FLYEXPLORE_CACHE"] = cache    # the fits made here, into an empty cache
        measure(json.loads(sys.stdin.read()))
