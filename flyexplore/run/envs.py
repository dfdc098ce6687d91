"""The environments of an environment A/B: what one is, read from text (``--env``), and checked
before anything runs.

An **environment** is a Python interpreter plus changes to environment variables, read when a
worker process starts: two torch builds (AOTriton 0.13b against 0.14.2b: torch picks the AOTriton
API when it is built, ``aten/src/ATen/native/transformers/hip/aotriton_versions.h``, so there is
no runtime switch), two flydsl versions, or one interpreter with other library settings
(``TORCH_BLAS_PREFER_HIPBLASLT``, ``PYTORCH_TUNABLEOP_ENABLED``, ``TORCH_ROCM_FA_PREFER_CK``). The
text form, as ``flyexplore sweep --env`` takes it (:func:`parse_env`)::

    NAME                              this interpreter, no changes
    NAME=/opt/envs/aot013/bin/python  another interpreter
    NAME:VAR=VALUE,VAR2=VALUE2        this interpreter with VAR set (VAR= sets it empty, -VAR unsets it)
    NAME=/path/to/python:VAR=VALUE    both

``NAME`` is 1 to 40 letters, digits, ``.``, ``_`` or ``-`` (it names the arms of the A/B:
``flash@NAME``). A value may hold commas where the text after a comma has no ``=``
(``X=0,1``); the interpreter's path may not hold ``:``.

How a worker finds flyexplore (``worker_code``): ``driver`` (default) runs the driver's own
flyexplore source in every environment (a folder holding only a link to the driver's
``flyexplore`` package goes first on the worker's ``PYTHONPATH``; nothing else of the driver's
packages does, so each environment keeps its own torch), so both sides measure with the same
code; ``env`` imports the flyexplore installed in that environment, whose version must be the
driver's. Either way a worker gets none of the driver's variables that change what Python imports
(:data:`IMPORT_VARS`: ``PYTHONPATH``, ``PYTHONHOME``, ...) unless the environment's text sets them
(``NAME:PYTHONPATH=/x``), and starts with ``PYTHONSAFEPATH=1`` (the driver's working folder does not
go first on its ``sys.path``): what it imports is its environment's, not the driver's.
:func:`probe` checks each environment in well under a second (a child interpreter with the
worker's variables that finds torch, numpy and flyexplore without importing torch), before any
file is opened.

On the CPU an A/B whose environments give a thread-count variable (:data:`THREAD_VARS`) different
values is refused (:func:`thread_refusal`): it could not see the change.
"""
from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import flyexplore
from flyexplore._version import __version__
from flyexplore.errors import UsageError
from flyexplore.measure.timing import quiet_profiler_log

#: An environment's name: what the arms of an A/B are called after (``flash@NAME``).
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$")
#: A variable name an environment may change.
VAR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Variables the A/B sets itself (one GPU for every environment, ``--device``): an environment
#: may not change them.
PINNED = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
#: How a worker finds flyexplore (see the module text).
WORKER_CODE = ("driver", "env")
#: The oldest Python flyexplore runs on (``pyproject.toml``'s ``requires-python``).
MIN_PYTHON = (3, 10)
#: Seconds a probe of one environment may take (a Python start-up, no torch import).
PROBE_TIMEOUT_S = 60.0
#: Fresh pairs of workers an A/B runs by default (``--pairs``). Calls of 40 µs or more read the
#: same kernel in two processes taking turns within 0.03-0.43% on an H200 (one pair is nearly
#: enough), but calls of 12-18 µs keep a per-process offset of 2-3% even when taking turns
#: (issue 32), which only fresh pairs can measure; with 3 the interval of the mean over the pairs
#: has t(2) = 4.3 and catches an offset that one pair would call an effect
#: (``benchmarks/evidence/ab_envs.py``, ``data/h200/ab/``).
PAIRS = 3
#: The most pairs ``--pairs auto`` gives a case (``--max-pairs``): on an H100, 8 pairs decided
#: effects of 3-6% that 3 pairs left AMBIGUOUS (issue 43: ``CUBLAS_WORKSPACE_CONFIG=:0:0``, bf16
#: GEMMs of 41-98 µs, each pair's estimate on the same side in 8 of 8); 10 leaves room for a
#: pair lost to a crash and keeps the looks few (8), so that the correction for looking again
#: (:class:`flyexplore.run.processes.PassRule`: 97.5% at the first look, 99.643% at each later one)
#: stays mild.
MAX_PAIRS = 10
#: The name of the A/A copy of an environment (:func:`aa_copy`).
AA_SUFFIX = "-aa"
#: The driver's variables that change what a Python process imports or where it looks: a worker
#: gets none of them unless its environment's text sets them (:func:`worker_environ`), or the
#: driver's would choose its code (issue 45: with ``PYTHONPATH`` at a flyexplore checkout, an
#: environment holding flyexplore 0.0.9 ran the driver's 0.1.0 under ``--worker-code env``). Why each (the Python
#: docs' "Command line and environment" page; ``__PYVENV_LAUNCHER__``: CPython's ``getpath``):
IMPORT_VARS = (
    "PYTHONPATH",          # folders put before the interpreter's own site-packages
    "PYTHONHOME",          # where the standard library and site-packages are: another Python's
    "PYTHONSTARTUP",       # a file run at start (interactive only, but it is the driver's code)
    "PYTHONUSERBASE",      # the user site-packages folder (~/.local): packages of the driver's choosing
    "PYTHONNOUSERSITE",    # whether the user site-packages is on sys.path at all
    "PYTHONSAFEPATH",      # whether the working folder goes first on sys.path (set by the A/B itself)
    "PYTHONPLATLIBDIR",    # the library folder name (lib, lib64) the interpreter looks in
    "PYTHONEXECUTABLE",    # sys.executable and sys.argv[0] on macOS: which venv's site-packages
    "__PYVENV_LAUNCHER__",  # macOS framework builds: the venv a launcher ran, read to find site-packages
    "PYTHONCASEOK",        # case-insensitive module names on Windows and macOS: another module may match
)
#: Variables that set how many threads a library uses (OpenMP, MKL, OpenBLAS, Accelerate,
#: numexpr, BLIS, torch, GotoBLAS). On the CPU an A/B's workers share one core
#: (:func:`flyexplore.run.envab.shared_cpus`) and torch is timed on one thread
#: (:data:`flyexplore.measure.timing.CPU_TIMING_THREADS`): environments that set one of them
#: differently are refused (:func:`thread_refusal`).
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
               "NUMEXPR_NUM_THREADS", "BLIS_NUM_THREADS", "TORCH_NUM_THREADS", "GOTO_NUM_THREADS")


@dataclass(frozen=True)
class Env:
    """One environment of an A/B: ``name``, ``python`` (an interpreter's path; None: the driver's
    own, ``sys.executable``) and ``changes`` (``(VAR, value)`` pairs in order; value None: the
    variable is removed)."""

    name: str
    python: str | None = None
    changes: tuple[tuple[str, str | None], ...] = ()

    @property
    def interpreter(self) -> str:
        """The interpreter a worker of this environment runs: ``python``, or ``sys.executable``."""
        return self.python or sys.executable

    def text(self) -> str:
        """The environment as :func:`parse_env` reads it (``NAME=/path:VAR=1,-VAR2``)."""
        out = self.name + (f"={self.python}" if self.python else "")
        if self.changes:
            out += ":" + ",".join(f"-{k}" if v is None else f"{k}={v}" for k, v in self.changes)
        return out

    def changes_text(self) -> str:
        """The changes in words: ``TORCH_BLAS_PREFER_HIPBLASLT=0, -X`` (``none``)."""
        return ", ".join(f"-{k}" if v is None else f"{k}={v}" for k, v in self.changes) or "none"

    def to_dict(self) -> dict:
        """JSON values: ``{"name", "python", "changes": {VAR: value or None}}``; ``python`` is the
        path given (None for the driver's interpreter)."""
        return {"name": self.name, "python": self.python, "changes": dict(self.changes)}

    def environ(self, base: dict | None = None) -> dict:
        """``base`` (default ``os.environ``) with this environment's changes applied."""
        e = dict(os.environ if base is None else base)
        for k, v in self.changes:
            if v is None:
                e.pop(k, None)
            else:
                e[k] = v
        return e


def parse_env(text) -> Env:
    """An :class:`Env` from its text (the module text gives the form), or an :class:`Env` as it
    is. Raises :class:`UsageError` naming the text: a bad or missing name, an empty interpreter
    path, a variable that is no name, one given twice, or one of :data:`PINNED`."""
    if isinstance(text, Env):
        return _checked(text, text.text())
    if not isinstance(text, str) or not text.strip():
        raise UsageError(f"bad --env {text!r}: give NAME, NAME=/path/to/python, NAME:VAR=VALUE or "
                         "NAME=/path/to/python:VAR=VALUE")
    t = text.strip()
    m = re.match(r"^([^=:]*)(=[^:]*)?(?::(.*))?$", t, re.S)
    if m is None:  # pragma: no cover - the pattern matches every text
        raise UsageError(f"bad --env {text!r}")
    name, py, rest = m.group(1).strip(), m.group(2), m.group(3)
    python = None
    if py is not None:
        python = py[1:].strip()
        if not python:
            raise UsageError(f"bad --env {text!r}: no interpreter after '=' (NAME=/path/to/python)")
    changes: list[tuple[str, str | None]] = []
    if rest is not None:
        if not rest.strip():
            raise UsageError(f"bad --env {text!r}: nothing after ':' (NAME:VAR=VALUE,VAR2=VALUE2)")
        for part in rest.split(","):
            p = part.strip()
            if p.startswith("-") and "=" not in p:
                changes.append((p[1:].strip(), None))
            elif "=" in p:
                k, _, v = part.partition("=")
                changes.append((k.strip(), v))
            elif changes and changes[-1][1] is not None:   # a value that holds a comma: X=0,1
                k, v = changes[-1]
                changes[-1] = (k, f"{v},{part}")
            else:
                raise UsageError(f"bad --env {text!r}: {p!r} is not VAR=VALUE or -VAR")
    return _checked(Env(name, python, tuple(changes)), text)


def _checked(e: Env, text: str) -> Env:
    if not NAME.match(e.name or ""):
        hint = (" (give each environment its own --env, or in Python a list: envs=['base', 'lt:X=1'])"
                if "," in (e.name or "") else "")
        raise UsageError(f"bad --env {text!r}: the name {e.name!r} must be 1 to 40 letters, digits, '.', '_' "
                         f"or '-', starting with a letter or digit{hint}")
    seen = set()
    for k, _ in e.changes:
        if not VAR.match(k):
            raise UsageError(f"bad --env {text!r}: {k!r} is not an environment variable name")
        if k in seen:
            raise UsageError(f"bad --env {text!r}: {k} is given twice")
        if k in PINNED:
            raise UsageError(f"bad --env {text!r}: {k} is set by the A/B itself (every environment runs on the "
                             "one GPU of --device)")
        seen.add(k)
    return e


def aa_copy(e: Env) -> Env:
    """The A/A copy of ``e``: the same interpreter and changes, named ``<name>-aa`` (the A/A
    flag: two workers of one environment measure the floor of an A/B)."""
    return Env((e.name + AA_SUFFIX)[:40] if len(e.name) + len(AA_SUFFIX) > 40 else e.name + AA_SUFFIX,
               e.python, e.changes)


def check_envs(envs, aa: bool = False) -> tuple[Env, ...]:
    """The environments of an A/B, each read by :func:`parse_env`, with the A/A copy added when
    ``aa`` (one environment given, or none: this interpreter, named ``base``). Raises
    :class:`UsageError` for fewer than two environments (without ``aa``), more than one with
    ``aa``, or a name given twice."""
    items = [envs] if isinstance(envs, (str, Env)) else list(envs or ())
    out = [parse_env(x) for x in items]
    if aa:
        if len(out) > 1:
            raise UsageError(f"--aa runs one environment against itself; give one --env, not {len(out)}")
        out = out or [Env("base")]
        out.append(aa_copy(out[0]))
    if len(out) < 2:
        raise UsageError("an environment A/B needs two or more --env (or one with --aa, the A/A floor)")
    names = [e.name for e in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UsageError(f"--env name {dup[0]!r} is given twice; each environment needs its own name")
    return tuple(out)


def thread_refusal(envs, device_type: str, base: dict | None = None) -> str | None:
    """Why an A/B of ``envs`` on a ``device_type`` (``"cpu"``, ``"cuda"``) device cannot run, as
    one line, or None: on the CPU, environments that give a variable of :data:`THREAD_VARS`
    different values -- each environment's value is its own change, else what its worker inherits
    from ``base`` (default ``os.environ``); unset counts as a value. An A/B's CPU workers share one
    core (:func:`flyexplore.run.envab.shared_cpus`) and time torch on one thread
    (:data:`flyexplore.measure.timing.CPU_TIMING_THREADS`), so such an A/B reads SAME or AMBIGUOUS
    whatever the variable does (issue 45: ``OMP_NUM_THREADS`` 1 vs 2 on a 2048^3 GEMM read 1.006x
    AMBIGUOUS). The same value in every environment, or a GPU, is fine. Never raises."""
    if device_type != "cpu":
        return None
    envs = tuple(envs)
    for var in THREAD_VARS:
        vals = [(e.name, e.environ(base).get(var)) for e in envs]
        if len({v for _, v in vals}) > 1:
            shown = ", ".join(f"env {n!r} {var}={v}" if v is not None else f"env {n!r} {var} unset"
                              for n, v in vals)
            return (f"{shown}: on the CPU an A/B's workers share one core and time torch on one thread, so the A/B "
                    f"cannot see a thread-count change; time each value in its own sweep with --timing cpu-wall "
                    f"and no --env, and compare the files with flyexplore compare (a CPU sweep times torch's own "
                    f"ops on one thread too: only a library outside torch's thread pool shows the change there)")
    return None


# -- the driver's flyexplore, for the workers --------------------------------------------------------

_CODE_DIR: list[str] = []


def code_dir() -> str:
    """A folder that holds only a link named ``flyexplore`` to this process's flyexplore package:
    what goes first on a worker's ``PYTHONPATH`` with ``worker_code="driver"`` (the driver's
    site-packages, and its torch, stay out). Made once per process, removed at exit."""
    if not _CODE_DIR:
        d = tempfile.mkdtemp(prefix="flyexplore-code-")
        os.symlink(Path(flyexplore.__file__).resolve().parent, os.path.join(d, "flyexplore"))
        atexit.register(shutil.rmtree, d, True)
        _CODE_DIR.append(d)
    return _CODE_DIR[0]


def driver_package() -> str:
    """The resolved folder of this process's flyexplore package."""

    return str(Path(flyexplore.__file__).resolve().parent)


def worker_environ(e: Env, worker_code: str = "driver", extra_paths=(), pin: dict | None = None,
                   base: dict | None = None) -> dict:
    """The environment variables a worker of ``e`` starts with (its probe's too, :func:`probe`):
    ``base`` (default ``os.environ``) without :data:`IMPORT_VARS`, then ``e``'s changes (which may
    set any of them), ``PYTHONSAFEPATH=1`` unless ``e`` sets or removes it (the working folder
    stays off ``sys.path``, Python 3.11 and newer), then ``PYTHONPATH`` led by :func:`code_dir`
    (with ``worker_code="driver"``) and ``extra_paths`` (where an operator given as
    ``module:attribute`` lives), followed by ``e``'s own ``PYTHONPATH`` if it sets one, then the
    GPU pinning ``pin`` (``None`` values removed)."""
    own = {k for k, _ in e.changes}
    env = e.environ({k: v for k, v in (os.environ if base is None else base).items() if k not in IMPORT_VARS})
    if "PYTHONSAFEPATH" not in own:
        env["PYTHONSAFEPATH"] = "1"
    lead = ([code_dir()] if worker_code == "driver" else []) + [str(p) for p in extra_paths]
    if lead:
        env["PYTHONPATH"] = os.pathsep.join(lead + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    for k, v in (pin or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    quiet_profiler_log(env)   # the profiler's noise off the worker's log, whose last lines a crashed row quotes
    return env


#: What a probe's child interpreter runs: finds torch, numpy and flyexplore (without importing
#: torch or numpy) and prints one JSON line.
_PROBE = r"""
import importlib.util as u, json, os, sys
out = {"python": list(sys.version_info[:3]), "executable": sys.executable}
for m in ("torch", "numpy"):
    try:
        out[m] = u.find_spec(m) is not None
    except Exception as exc:
        out[m] = False
try:
    import flyexplore._version as v, flyexplore
    out["flyexplore"] = v.__version__
    out["flyexplore_file"] = os.path.realpath(os.path.dirname(flyexplore.__file__))
except Exception as exc:
    out["flyexplore"] = None
    out["flyexplore_error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def probe(e: Env, worker_code: str = "driver", extra_paths=(), timeout: float = PROBE_TIMEOUT_S) -> dict:
    """Check that a worker of ``e`` can start, before anything runs or any file is opened: the
    interpreter exists and runs (Python >= :data:`MIN_PYTHON`), finds torch and numpy, and imports
    flyexplore -- the driver's (``worker_code="driver"``: checked to be the driver's package) or
    its own (``"env"``: its version must be the driver's). The child runs with the worker's
    variables (:func:`worker_environ`), so it imports what the worker will. Returns what the child
    reported (``python``, ``executable``, ``flyexplore``, ``flyexplore_file``). Raises
    :class:`UsageError`, one line naming the environment and what is missing: for an interpreter
    that does not print the check's JSON line, its exit code and the first lines it printed
    (:data:`SAID_CHARS` characters), else its stderr's last line; where the driver's own
    interpreter lacks torch or numpy while the driver has a ``PYTHONPATH``, how to pass that in the
    environment's text."""
    if worker_code not in WORKER_CODE:
        raise UsageError(f"bad worker_code {worker_code!r} (valid: {', '.join(WORKER_CODE)})")
    py = e.interpreter
    who = f"env {e.name!r} ({py})"
    if e.python is not None:
        p = Path(py)
        if not p.exists():
            raise UsageError(f"{who}: the interpreter does not exist")
        if p.is_dir():
            inner = next((q for q in (p / "bin" / "python", p / "bin" / "python3") if q.exists()), None)
            raise UsageError(f"{who}: is a folder, not an interpreter"
                             + (f" (did you mean {inner}?)" if inner else ""))
        if not os.access(p, os.X_OK):
            raise UsageError(f"{who}: the interpreter is not an executable file")
    try:
        r = subprocess.run([py, "-c", _PROBE], env=worker_environ(e, worker_code, extra_paths),
                           capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise UsageError(f"{who}: the interpreter did not answer within {timeout:g} s") from None
    except OSError as exc:
        raise UsageError(f"{who}: the interpreter cannot start ({exc.strerror or exc})") from None
    lines = r.stdout.strip().splitlines()
    try:
        got = json.loads(lines[-1])
        if not isinstance(got, dict):
            raise ValueError(got)
    except (ValueError, IndexError):
        raise UsageError(f"{who}: the interpreter does not run flyexplore's check ({_said(r)})") from None
    if tuple(got.get("python", ())) < MIN_PYTHON:
        raise UsageError(f"{who}: Python {'.'.join(map(str, got.get('python', ())))}; flyexplore needs "
                         f"{'.'.join(map(str, MIN_PYTHON))} or newer")
    for m in ("torch", "numpy"):
        if not got.get(m):
            raise UsageError(f"{who}: no {m} there (install it in that environment){_path_hint(e)}")
    if got.get("flyexplore") is None:
        why = got.get("flyexplore_error", "not importable")
        if worker_code == "env":
            raise UsageError(f"{who}: no flyexplore installed there ({why}); install flyexplore {__version__} in it, "
                             f"or use --worker-code driver to run the driver's source there{_path_hint(e)}")
        raise UsageError(f"{who}: the driver's flyexplore source does not import there ({why})")
    if worker_code == "driver" and got.get("flyexplore_file") != driver_package():
        raise UsageError(f"{who}: imports flyexplore from {got.get('flyexplore_file')}, not the driver's "
                         f"{driver_package()}")
    if got["flyexplore"] != __version__:
        raise UsageError(f"{who}: flyexplore {got['flyexplore']} at {got.get('flyexplore_file')}, the driver runs "
                         f"{__version__}: install the same version there, or use --worker-code driver")
    return got


#: Characters of a probe's output quoted in its refusal (:func:`probe`).
SAID_CHARS = 200


def _said(r: subprocess.CompletedProcess) -> str:
    """What a probe's child said, for its refusal: its exit code and the first lines it printed
    (joined with `` | ``, cut to :data:`SAID_CHARS`), else its stderr's last line, else that it
    printed nothing."""
    out = [ln.strip() for ln in r.stdout.splitlines() if ln.strip()]
    if out:
        text = " | ".join(out)
        cut = text if len(text) <= SAID_CHARS else text[:SAID_CHARS] + "..."
        n = f"{len(out)} line{'s' if len(out) != 1 else ''}"
        return f"exit {r.returncode}; it printed {n}, not the check's JSON: {cut!r}"
    err = [ln.strip() for ln in r.stderr.splitlines() if ln.strip()]
    if err:
        return f"exit {r.returncode}; nothing on stdout, stderr ends: {err[-1][:SAID_CHARS]!r}"
    return f"exit {r.returncode}; it printed nothing"


def _path_hint(e: Env, base: dict | None = None) -> str:
    """For a refusal of an environment that runs the driver's own interpreter without a
    ``PYTHONPATH`` of its own, where the driver has one: that the driver's is not passed to the
    workers (:data:`IMPORT_VARS`) and how to give it (``''`` otherwise)."""
    pp = (os.environ if base is None else base).get("PYTHONPATH")
    same = e.python is None or os.path.abspath(e.python) == os.path.abspath(sys.executable)
    if not pp or not same or any(k == "PYTHONPATH" for k, _ in e.changes):
        return ""
    return (f"; the driver's PYTHONPATH ({pp}) is not passed to an environment's workers: give it in the "
            f"environment, --env {e.name}{'=' + e.python if e.python else ''}:PYTHONPATH={pp}")


def extra_paths_for(op_ref: str) -> tuple[str, ...]:
    """Where a worker finds an operator given as ``module:attribute`` (a folder for
    ``PYTHONPATH``: the one holding the module's top package, as this process imported it);
    none for a catalogue name."""
    import sys

    if ":" not in op_ref:
        return ()
    mod = op_ref.partition(":")[0]
    m = sys.modules.get(mod)
    f = getattr(m, "__file__", None)
    if not f:
        return ()
    root = os.path.dirname(os.path.abspath(f))
    for _ in range(mod.count(".")):
        root = os.path.dirname(root)
    return (root,)
