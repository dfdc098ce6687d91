"""Walkthrough notebooks: their sizes, and running them headless.

The notebooks in ``notebooks/`` only call the library. Their first code cell is a
papermill-style ``parameters`` cell (a cell tagged ``parameters``) with ``SIZE`` (``"cpu"``:
shapes that finish in seconds on a 2-core CPU; ``"gpu"``: LLM-sized shapes for one GPU;
``"test"``: the least work that still shows everything the notebook shows at ``"cpu"``, what
``tests/ui/test_notebooks.py`` and the browser tests run) and ``OUT`` (a folder for the files a
notebook writes). :func:`execute` runs a notebook top to bottom with nbclient after inserting a
cell tagged ``injected-parameters`` below the ``parameters`` cell, as papermill does, so the
same notebook runs on a CPU in CI and on a GPU.

What each size sweeps is decided here (:func:`sweep_args`), not in the notebooks; so are the
RMSNorm/TopK walkthrough's eligibility grids (:data:`ELIGIBILITY_GRIDS`) and X-ray cases
(:data:`XRAY_RMSNORM`), and :func:`xray_figure` gives that figure or, where the X-ray cannot run,
a :class:`Note` saying why (a notebook cell has no ``if``).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from flyexplore.atomic import write_file
from flyexplore.errors import UsageError, bad_choice
from flyexplore.insight import xray as XR
from flyexplore.paths import repo_dir
from flyexplore.views.xray import resources_figure

#: Walkthrough sizes: ``cpu`` (seconds on a 2-core CPU), ``gpu`` (one GPU, a few minutes) and
#: ``test`` (the notebook tests: the ``cpu`` walkthrough's rows, figures and texts at the least work).
SIZES = ("cpu", "gpu", "test")

#: Timer options of the CPU walkthrough sweeps (few repetitions: seconds on 2 cores).
CPU_TIMER = {"warmup": 2, "rep": 10}
#: Timer options of the test size: one warm-up call and three timed ones, the fewest that still
#: give every ``ok`` row a median of samples (its number is not one to read).
TEST_TIMER = {"warmup": 1, "rep": 3}

#: What a walkthrough sweeps per (name, size): keyword arguments of
#: ``fx.sweep`` (:class:`flyexplore.run.spec.SweepSpec`) and :class:`flyexplore.ui.panel.SweepPanel` (``suite`` or
#: ``shapes``, ``dtypes``, and where set ``backends``, ``timer`` and ``pairs``). A name is an operator
#: (``gemm``) or ``operator:purpose`` (``gemm:m-sweep``) when a walkthrough needs a second set.
#: CPU: each operator's ``cpu-small`` suite or a few small shapes, with :data:`CPU_TIMER`.
#: Test: the CPU walkthrough's rows at the least work -- what a notebook's checks count (cases,
#: backends, the two published dense shapes) kept, :data:`TEST_TIMER`, the SDPA sweep at two
#: small cases (forward and backward: every backend's row and reason is there) instead of five,
#: and the environment A/B at 2 fresh pairs of workers (4 worker starts, each a torch import;
#: about 17 CPU-s on 2 cores) instead of ``auto`` (3 pairs and a spare launched for a fourth: 8
#: starts, about 34 CPU-s).
#: GPU: shapes sized for one GPU that keep all walkthroughs together within a few minutes on an
#: H200, preferring backends that do not autotune (Triton's max-autotune costs 5-10 s per GEMM
#: shape there): three Llama-3.1-8B GEMMs for the quickstart (shapes from the ``llama3.1-8b``
#: suite), an M sweep at N=K=4096 (published dense shapes), grouped GEMMs of Mixtral-8x7B and
#: Qwen3-30B-A3B experts, MXFP8/MXFP4 at two published MXFP shapes, four SDPA cases of
#: Llama-3.1-8B (prefill causal forward and backward, GQA, decode), and the ``llm`` suites of
#: RMSNorm and TopK. ``flydsl`` stays in every GPU list: unavailable rows cost nothing, and on
#: an MI350 they are the point.
WALKTHROUGH_SWEEPS: dict[tuple[str, str], dict[str, Any]] = {
    ("gemm", "cpu"): {"suite": "cpu-small"},
    ("gemm", "gpu"): {"shapes": "16x6144x4096;2048x6144x4096;2048x4096x14336", "dtypes": ["bf16"]},
    ("gemm:m-sweep", "cpu"): {"shapes": "32x256x256;128x256x256;512x256x256;1024x256x256", "dtypes": ["fp32"],
                              "backends": ["aten", "inductor", "flydsl"], "timer": CPU_TIMER},
    ("gemm:m-sweep", "gpu"): {"shapes": "16x4096x4096;64x4096x4096;256x4096x4096;1024x4096x4096;4096x4096x4096",
                              "dtypes": ["bf16"], "backends": ["aten", "inductor", "flydsl"]},
    ("gemm:published", "cpu"): {"shapes": "8x4096x4096;16x4096x4096", "dtypes": ["bf16"],
                                "backends": ["aten", "flydsl"], "timer": CPU_TIMER},
    ("gemm:published", "gpu"): {"shapes": "16x4096x4096;128x4096x4096;1024x4096x4096;4096x4096x4096;16x28672x4096",
                                "dtypes": ["bf16"], "backends": ["aten", "flydsl"]},
    ("grouped_gemm", "cpu"): {"suite": "cpu-small", "timer": CPU_TIMER},
    ("grouped_gemm", "gpu"): {"shapes": "8x128x28672x4096;8x1024x4096x14336;128x32x1536x2048;128x256x2048x768",
                              "dtypes": ["bf16"], "backends": ["aten", "reference", "flydsl"]},
    ("scaled_gemm", "cpu"): {"suite": "cpu-small", "timer": CPU_TIMER},
    ("scaled_gemm", "gpu"): {"shapes": "128x4096x4096;2048x4096x4096", "dtypes": ["mxfp8", "mxfp4"],
                             "backends": ["aten", "flydsl", "emulated"]},
    ("attention", "cpu"): {"suite": "cpu-small", "timer": CPU_TIMER},
    ("attention", "gpu"): {"shapes": "1x32x4096x4096x128:causal=1;1x32x4096x4096x128:causal=1,bwd;"
                                     "1x32x4096x4096x128:causal=1,hkv=8;32x32x1x4096x128:hkv=8",
                           "dtypes": ["bf16"]},
    # an environment A/B of SDPA (the AOTriton notebook): flash in each environment, timed round by round
    ("attention:env-ab", "cpu"): {"shapes": "1x4x256x256x64", "dtypes": ["fp32"], "backends": ["flash"]},
    ("attention:env-ab", "gpu"): {"shapes": "1x32x4096x4096x128:causal=1;4x32x2048x2048x128", "dtypes": ["bf16"],
                                  "backends": ["flash"]},
    ("rmsnorm", "cpu"): {"suite": "cpu-small"},
    ("rmsnorm", "gpu"): {"suite": "llm"},
    ("topk", "cpu"): {"suite": "cpu-small"},
    ("topk", "gpu"): {"suite": "llm"},
    # test: the CPU rows at the least work (see above)
    ("gemm", "test"): {"suite": "cpu-small", "timer": TEST_TIMER},
    ("gemm:m-sweep", "test"): {"shapes": "32x256x256;128x256x256;512x256x256;1024x256x256", "dtypes": ["fp32"],
                               "backends": ["aten", "inductor", "flydsl"], "timer": TEST_TIMER},
    ("gemm:published", "test"): {"shapes": "8x4096x4096;16x4096x4096", "dtypes": ["bf16"],
                                 "backends": ["aten", "flydsl"], "timer": TEST_TIMER},
    ("grouped_gemm", "test"): {"suite": "cpu-small", "timer": TEST_TIMER},
    ("scaled_gemm", "test"): {"suite": "cpu-small", "timer": TEST_TIMER},
    ("attention", "test"): {"shapes": "1x2x64x64x32:causal=1;1x2x64x64x32:causal=1,bwd", "dtypes": ["fp32"],
                            "timer": TEST_TIMER},
    ("attention:env-ab", "test"): {"shapes": "1x2x64x64x32", "dtypes": ["fp32"], "backends": ["flash"],
                                   "pairs": 2, "timer": TEST_TIMER},
    ("rmsnorm", "test"): {"suite": "cpu-small", "timer": TEST_TIMER},
    ("topk", "test"): {"suite": "cpu-small", "timer": TEST_TIMER},
}

#: Eligibility grids of the RMSNorm/TopK walkthrough (pure rules, the same at every size):
#: M and N of RMSNorm around its tuned region's edges (N 4096 / 8192 / 16384 / 114688; M 2048 /
#: 4096 / 8192), N and K of TopK across its register and radix bands (M = 2048 rows: at least one
#: per CU of an MI355X, and every band's largest N within the 4 GiB buffer span in fp32).
ELIGIBILITY_GRIDS: dict[str, dict[str, Any]] = {
    "rmsnorm": {"ms": [256, 1024, 2048, 4096, 8192, 16384, 65536],
                "ns": [1024, 2048, 4096, 6144, 8192, 12288, 16384, 32768, 65536, 114688, 131072]},
    "topk": {"ms": 2048, "ns": [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144],
             "dims": {"k": [2, 8, 16, 32, 64, 128, 256, 300, 512, 1024]}},
}
#: RMSNorm cases of the walkthrough's kernel X-ray: N across the tuned region at an M it takes
#: (compile-only, about 1 s per kernel after a 3 s start), and one case it does not take.
XRAY_RMSNORM = ("8192x4096", "4096x8192", "2048x16384", "2048x32768", "2048x65536", "2048x114688",
                "1024x4096")


class Note:
    """A message a walkthrough shows instead of a result it cannot produce here (Markdown in
    Jupyter, plain text elsewhere); ``text`` says what is missing and how to get it."""

    def __init__(self, text: str):
        self.text = text

    def _repr_markdown_(self) -> str:
        return f"> **Not shown here.** {self.text}"

    def __repr__(self) -> str:
        return f"Not shown here. {self.text}"


def xray_figure(op: str = "rmsnorm", shapes=XRAY_RMSNORM, dtype: str = "bf16", out=None):
    """The kernel X-ray resources figure (:func:`flyexplore.views.xray.resources_figure`) of ``op``
    at ``shapes`` in ``dtype`` for gfx950 (compile-only, one subprocess), or, where
    :mod:`flyexplore.world.env` says the X-ray cannot run on this machine (no torch >= 2.15, no flydsl
    0.3, no LLD >= 19), a :class:`Note` naming every failed check and its fix. ``out``: a folder
    for the ISA files and ``xray.json`` per case (also ``xray.csv`` with every row). Raises
    :class:`UsageError` for a bad operator, shape or dtype."""

    why = XR.unavailable_reason()
    if why:
        return Note(f"The kernel X-ray cannot run on this machine: {why}. It needs no GPU: torch >= 2.15, "
                    "flydsl 0.3.x and an AMDGPU-capable ld.lld (Debian: apt-get install lld-22).")
    xs = XR.xray_batch([(op, s, dtype) for s in shapes], arch="gfx950", out=None if out is None else str(out))
    df = XR.xray_frame(xs)
    if out is not None:
        write_file(Path(out) / "xray.csv", lambda t: df.to_csv(t, index=False))
    return resources_figure(df)


#: Tag of the cell holding a notebook's default parameters, and of the inserted cell.
PARAMETERS_TAG = "parameters"
INJECTED_TAG = "injected-parameters"


def check_size(size: str) -> str:
    """Return ``size`` if it is one of :data:`SIZES` (``cpu``, ``gpu``, ``test``); else :class:`UsageError`."""
    if size not in SIZES:
        raise bad_choice("walkthrough size", size, SIZES)
    return size


def sweep_args(size: str, op: str = "gemm") -> dict[str, Any]:
    """Keyword arguments for ``fx.sweep`` (:class:`flyexplore.run.spec.SweepSpec`) and
    :class:`flyexplore.ui.panel.SweepPanel` that a walkthrough uses for ``op`` (an operator or
    ``operator:purpose``) at ``size`` (:data:`SIZES`): ``{"op": ..., "suite": ...}`` or
    ``{"op": ..., "shapes": ..., "dtypes": [...]}``, with ``backends``, ``timer`` and (an
    environment A/B) ``pairs`` where set (see :data:`WALKTHROUGH_SWEEPS`; the returned ``op`` is
    the operator name). Copies: changing the result does not change the table. Raises :class:`UsageError` for an unknown size or
    operator."""
    check_size(size)
    ops = sorted({o for o, _ in WALKTHROUGH_SWEEPS})
    if (op, size) not in WALKTHROUGH_SWEEPS:
        raise bad_choice("walkthrough operator", op, ops)
    entry = {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
             for k, v in WALKTHROUGH_SWEEPS[(op, size)].items()}
    return {"op": op.split(":")[0], **entry}


def notebooks_dir() -> Path:
    """``notebooks/`` at the top of the repository (next to the package; installed editable)."""
    return repo_dir() / "notebooks"


def list_notebooks(folder: str | os.PathLike | None = None) -> list[Path]:
    """The walkthrough notebooks (``*.ipynb``, sorted by name) in ``folder``
    (default :func:`notebooks_dir`)."""
    return sorted(Path(folder or notebooks_dir()).glob("*.ipynb"))


def _tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def inject_parameters(nb, parameters: Mapping[str, Any]):
    """Insert a code cell tagged ``injected-parameters`` assigning ``parameters`` (as Python
    literals) right below the cell tagged ``parameters``, replacing an earlier injected cell,
    as papermill does. Modifies and returns the ``nbformat`` notebook. Raises
    :class:`UsageError` if the notebook has no ``parameters`` cell or a name is not an
    identifier."""
    import nbformat

    for name in parameters:
        if not str(name).isidentifier():
            raise UsageError(f"notebook parameter name {name!r} is not a Python identifier")
    cells = [c for c in nb.cells if INJECTED_TAG not in _tags(c)]
    idx = [i for i, c in enumerate(cells) if PARAMETERS_TAG in _tags(c)]
    if not idx:
        raise UsageError("notebook has no cell tagged 'parameters' to inject parameters after")
    src = "# Parameters injected by flyexplore.ui.notebooks.execute\n" + "".join(
        f"{k} = {v!r}\n" for k, v in parameters.items())
    cell = nbformat.v4.new_code_cell(src, metadata={"tags": [INJECTED_TAG]})
    cells.insert(idx[0] + 1, cell)
    nb.cells = cells
    return nb


def kernel_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a notebook kernel: this process's, with the folder holding the
    ``flyexplore`` package first on ``PYTHONPATH`` (so an uninstalled checkout works too)."""
    env = dict(os.environ)
    root = str(repo_dir())
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(extra or {})
    return env


def execute(path: str | os.PathLike, out: str | os.PathLike | None = None, *,
            parameters: Mapping[str, Any] | None = None, cwd: str | os.PathLike | None = None,
            timeout: float = 600, kernel_name: str = "python3",
            env: Mapping[str, str] | None = None, slim: bool = False):
    """Run the notebook at ``path`` top to bottom in a fresh kernel and return the executed
    ``nbformat`` notebook (outputs and widget state included); write it to ``out`` if given.

    ``parameters`` are injected below the ``parameters`` cell (:func:`inject_parameters`);
    ``cwd`` is the kernel's working folder (default: the notebook's folder); ``timeout`` bounds
    each cell, in seconds; ``env`` adds environment variables for the kernel; ``slim`` applies
    :func:`slim_widget_state` to the executed notebook. Any failure -- a failing cell
    (``nbclient.exceptions.CellExecutionError``, its traceback in the message), a cell running
    past ``timeout`` (``CellTimeoutError``), a kernel that dies (``DeadKernelError``) or does not
    start, or an interrupt -- is re-raised after the partly executed notebook (every output up to
    the failing cell) is written to ``out``, with the failure recorded in its metadata under
    ``metadata["flyexplore"]["failure"]``. Needs nbclient, nbformat and ipykernel (the ``test`` or
    ``notebook`` extra).
    """
    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    if not path.exists():
        raise UsageError(f"notebook not found: {str(path)!r}")
    nb = nbformat.read(path, as_version=4)
    if parameters:
        inject_parameters(nb, parameters)
    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel_name,
                            resources={"metadata": {"path": str(cwd or path.parent)}},
                            store_widget_state=True)
    try:
        client.execute(env=kernel_env(env))
    except BaseException as exc:  # every kind of failure keeps what ran (then re-raises)
        nb.metadata.setdefault("flyexplore", {})["failure"] = (
            f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:500])
        if slim:
            slim_widget_state(nb)
        if out is not None:
            _write(nb, out)
        raise
    if slim:
        slim_widget_state(nb)
    if out is not None:
        _write(nb, out)
    return nb


def _write(nb, out) -> None:
    """Write the executed notebook to ``out`` whole or not at all (:mod:`flyexplore.atomic`)."""
    import nbformat

    write_file(out, lambda t: nbformat.write(nb, t))


#: ES module stored instead of a large anywidget bundle by :func:`slim_widget_state`.
SLIM_ESM = ("export default { render({ el }) { el.textContent = "
            "'(interactive widget: its JavaScript bundle is not stored in this copy; "
            "run the notebook to see it)'; } };")


def slim_widget_state(nb, max_bytes: int = 100_000):
    """Replace the JavaScript bundle (``_esm``) of stored anywidget states larger than
    ``max_bytes`` with :data:`SLIM_ESM`, a module that says the widget is live-only. plotly's
    ``FigureWidget`` stores plotly.js (about 5 MB) in every saved copy, while its traces are
    sent as messages and are not in the stored state, so a static view could not draw it
    anyway. Modifies and returns the notebook; other widget states are kept as they are."""
    state = (nb.metadata.get("widgets", {})
             .get("application/vnd.jupyter.widget-state+json", {}).get("state", {}))
    for model in state.values():
        s = model.get("state", {})
        if isinstance(s.get("_esm"), str) and len(s["_esm"]) > max_bytes:
            s["_esm"] = SLIM_ESM
    return nb
