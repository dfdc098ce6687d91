"""The operator catalogue's building blocks: :class:`Case`, :class:`Backend`, :class:`Suite`
and :class:`Operator`.

Each operator family lives in one module of :mod:`flyexplore.ops` and registers its backends
beside it with :meth:`Operator.backend` (tritonbench's registry, without the base class). A
backend that cannot run here returns its reason from ``available``; it is recorded as
unavailable and never replaced by another backend.
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from flyexplore.errors import UsageError, bad_choice
from flyexplore.parsing import DTYPE_NAMES, FALSE_WORDS, TRUE_WORDS
from flyexplore.paths import model_shapes_dir

#: Bytes per element for byte counts (MXFP4 is 0.5; e8m0 scales are counted separately).
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp64": 8, "fp8_e4m3": 1, "fp8_e5m2": 1,
               "mxfp8": 1, "mxfp4": 0.5}


def torch_dtype(name: str):
    """``"bf16"`` -> ``torch.bfloat16``. Raises :class:`UsageError` for an unknown name."""
    import torch

    if name not in DTYPE_NAMES:
        raise bad_choice("dtype", name, DTYPE_NAMES)
    return getattr(torch, DTYPE_NAMES[name])


@dataclass(frozen=True)
class Case:
    """One point of an operator's parameter space. ``params`` is an ordered tuple of
    ``(name, value)`` pairs; ``label`` is the canonical text form (``"8x4096x4096:NT"``).
    """

    op: str
    params: tuple[tuple[str, Any], ...]
    label: str

    @property
    def p(self) -> dict[str, Any]:
        return dict(self.params)

    def __getitem__(self, key: str) -> Any:
        return self.p[key]


#: The largest element count or dimension torch can index (``int64_t``): a larger one makes
#: torch raise ``OverflowError`` (or "Storage size calculation overflowed") while allocating.
INT64_MAX = 2 ** 63 - 1


@dataclass(frozen=True)
class TensorSize:
    """One tensor a case allocates, as the operator's ``tensors`` hook describes it (pure Python,
    no torch): ``name`` (``"a"``, ``"out"``), ``role`` (``"input"``: built by ``make_inputs`` and
    held for the whole case; ``"output"``: returned by one backend call; ``"work"``: an
    intermediate whose size follows neither, built by the reference or the check, e.g.
    attention's scores [B, H, SQ, SKV]), ``shape`` (the storage shape, e.g. ``[M, K/2]`` for
    packed FP4) and ``itemsize`` (bytes per element of that storage). The memory estimate
    (:mod:`flyexplore.run.memory`) fits one measured factor per role."""

    name: str
    role: str
    shape: tuple[int, ...]
    itemsize: int

    @property
    def numel(self) -> int:
        """Elements of the storage (a Python int: exact, even past int64)."""
        n = 1
        for d in self.shape:
            n *= int(d)
        return n

    @property
    def nbytes(self) -> int:
        """Bytes of the storage: :attr:`numel` x :attr:`itemsize`."""
        return self.numel * self.itemsize

    def text(self) -> str:
        """``a [65536, 4096]``."""
        return f"{self.name} [{', '.join(str(d) for d in self.shape)}]"


@dataclass(frozen=True)
class RunContext:
    """What a backend needs to know about where it runs: the torch device and the
    :class:`~flyexplore.world.env.Environment`."""

    device: Any
    env: Any

    @property
    def gpu(self) -> bool:
        return self.device.type == "cuda"


@dataclass(frozen=True)
class Backend:
    """One way to run an operator.

    ``build(case, dtype, inputs, ctx)`` returns a zero-argument callable that runs the
    operator once and returns its output. ``available(ctx, case, dtype)`` returns ``None`` when
    the backend can run, else the reason in words. ``context(ctx, case)`` returns a context
    manager entered around building, warm-up and timing (for example FlyDSL overrides off for ``aten``).
    ``source`` is ``"measured"`` or ``"emulated"`` (emulated rows are labelled as such).
    """

    name: str
    build: Callable
    doc: str
    available: Callable = lambda ctx, case, dtype: None
    context: Callable = lambda ctx, case: contextlib.nullcontext()
    source: str = "measured"
    baseline: bool = False


@dataclass(frozen=True)
class Suite:
    """A named set of cases for one operator, with the dtypes it is meant for and where the
    shapes come from (``source``: a published benchmark, a model, or ``"flyexplore"``)."""

    name: str
    op: str
    cases: tuple[Case, ...]
    dtypes: tuple[str, ...]
    description: str
    source: str
    case_dtypes: tuple[tuple[Case, str], ...] = ()

    def pairs(self, dtypes: Iterable[str] | None = None) -> tuple[tuple[Case, str], ...]:
        """(case, dtype) pairs to run: the suite's own per-case dtypes (published suites
        name a dtype per case) unless ``dtypes`` is given, else every case x dtype."""
        if dtypes is None and self.case_dtypes:
            return self.case_dtypes
        ds = tuple(dtypes) if dtypes is not None else self.dtypes
        return tuple((c, d) for c in self.cases for d in ds)


@dataclass(frozen=True)
class PublishedSuite:
    """One published table of an operator family: its file under ``data/published``, the
    operator, where it was published and the setup as published (from ``SOURCES.md``), and
    ``load(suite, builders) -> list of result rows`` (``source="published"``): the results layer
    (:mod:`flyexplore.results.published`) calls it with its row builders (``read_table``,
    ``published_row``, ``throughput_rows``), so a family never imports the results layer.
    Registered on the :class:`Operator` (``op.published``)."""

    name: str
    file: str
    op: str
    publication: str
    setup: str
    timing_mode: str | None = None
    load: Callable | None = field(default=None, compare=False, repr=False)

    @property
    def provenance(self) -> str:
        return f"{self.publication}; {self.setup}; data/published/{self.file}"


@dataclass(frozen=True)
class KernelPattern:
    """One FlyDSL kernel name as the profiler shows it: ``regex`` on the kernel's head (name
    without ``void``, template arguments or parameters), the ``library`` it stands for (the
    trace's ``observed`` text) and ``why`` the pattern means that (its source)."""

    regex: str
    library: str
    why: str = "torch 2.15 @flyc.kernel function name"

    def __post_init__(self):
        try:
            re.compile(self.regex)
        except re.error as exc:
            raise ValueError(f"bad kernel-name pattern {self.regex!r} for {self.library!r}: {exc}") from None


#: The routes torch 2.15 has to FlyDSL (:class:`FlyDSLPath` ``route``).
ROUTES = ("eager", "compile", "aotriton")


@dataclass(frozen=True)
class FlyDSLPath:
    """How torch 2.15 routes one operator family to FlyDSL, and what flyexplore knows of it.
    Registered on the :class:`Operator` (``op.flydsl``); the explainer, switches, trace,
    X-ray and published data dispatch through it (``docs/adding-an-operator.md``).

    ``route``: ``"eager"`` (a ``torch/_native`` override, switched by
    ``torch.backends.python_native``), ``"compile"`` (an Inductor template, switched by
    ``max_autotune_gemm_backends``) or ``"aotriton"`` (SDPA through AOTriton, whose tuning
    table picks the backend). ``path``: that route in one line. ``judge(call, env, common)``:
    pops its arguments from the ``call`` dict (tensors or
    :class:`~flyexplore.world.conditions.TensorDesc`) and returns ``(arguments shown, call and config
    conditions, FlyDSL kernel or None, notes)``; ``common`` holds the compile route's
    ``dynamic`` / ``autotuning`` / ``search_space`` / ``assume_aligned_inputs``.
    ``describe(case, dtype, opts, device)``: the ``judge`` call for a catalogue
    :class:`Case`, popping the ``options`` it reads from ``opts``. ``options``: the explainer's
    ``key=value`` options (``flyexplore explain --opt``). ``example``: a shape for help texts.
    ``kernels``: the FlyDSL kernels' names (:class:`KernelPattern`). ``aten_ops`` and
    ``module`` (eager route): the overridden ``aten`` op symbols and the torch module holding
    the override. ``xray``: ``"module:function"`` of the X-ray builder (``None``: no X-ray).
    ``case_notes(case)``: notes on what of a catalogue case the rules do not model.
    ``explain_text(shape, dtype, options, **kw)``: a family's own front door replacing the
    generic ``judge``/``describe`` one (attention: :func:`flyexplore.ops.attention.flydsl.
    explain_attention_options`). ``trace_columns(trace, case, dtype)``: ``flydsl_taken`` /
    ``flydsl_reason`` of a traced row when the family, not the kernel names, knows what ran
    (attention: which AOTriton backend, :func:`flyexplore.ops.attention.aotriton.aotriton_trace_columns`).
    ``kernel_table(**kw)``: a ``pandas.DataFrame`` of which FlyDSL kernel covers which calls
    (``fx.kernels(op)``; TopK: its kernel bands, attention: AOTriton's FlyDSL head dims)."""

    route: str
    path: str
    judge: Callable | None = None
    describe: Callable | None = None
    options: tuple[str, ...] = ()
    example: str = ""
    kernels: tuple[KernelPattern, ...] = ()
    aten_ops: tuple[str, ...] = ()
    module: str | None = None
    xray: str | None = None
    case_notes: Callable | None = None
    explain_text: Callable | None = None
    trace_columns: Callable | None = None
    kernel_table: Callable | None = None

    def __post_init__(self):
        if self.route not in ROUTES:
            raise ValueError(f"unknown FlyDSL route {self.route!r} (valid: {', '.join(ROUTES)})")
        if (self.judge is None) != (self.describe is None):
            raise ValueError(f"FlyDSL path {self.path!r} needs both judge and describe, or neither "
                             "(then the explainer does not cover it)")
        if self.route == "eager" and not self.aten_ops:
            raise ValueError(f"eager FlyDSL path {self.path!r} needs aten_ops (the overridden aten op symbols)")


#: The views of a captured model step (:mod:`flyexplore.insight.capture`): ``eager`` (what ATen
#: and the eager overrides see) and ``compiled`` (what Inductor lowers).
MODEL_VIEWS = ("eager", "compiled")


@dataclass(frozen=True)
class ModelCall:
    """What a family makes of one captured call (:attr:`ModelHooks.judge`): either the keyword
    arguments of its FlyDSL ``judge`` (``args``; judged by the explainer, or by the family's
    ``explain_text`` front door when ``args`` holds ``shape`` and ``dtype``), or a verdict decided
    without the rules (``status``: ``"not eligible"``, ``"no FlyDSL path"`` or ``"unverified"``,
    with ``category`` -- a short group label -- and ``reason``, one line). ``notes``: sentences
    added to the verdict either way."""

    args: Mapping[str, Any] | None = None
    status: str | None = None
    category: str = ""
    reason: str = ""
    notes: tuple[str, ...] = ()

    def __post_init__(self):
        if (self.args is None) == (self.status is None):
            raise ValueError("ModelCall needs exactly one of args (judged by the rules) and status (decided here)")


@dataclass(frozen=True)
class ModelHooks:
    """What an operator family knows of a captured model step (``Operator.model``): the capture,
    the coverage verdicts, the shares and the exported shapes read it, and nothing outside the
    family's folder names the family (``docs/adding-an-operator.md``, section 7).

    A captured call is handed over as :class:`flyexplore.insight.capture.Call` (``op``,
    ``inputs`` / ``outputs`` as :class:`~flyexplore.world.conditions.TensorDesc`, ``scalars``,
    ``arg(name)``, ``dtype``).

    - ``aten_ops``: the ATen overloads the family claims, as the dispatcher names them
      (``"aten.mm.default"``); a captured call of one of them belongs to the family.
    - ``view``: the capture view that decides the family (:data:`MODEL_VIEWS`): ``"eager"`` for
      an eager override, ``"compiled"`` for an Inductor template. Exported shapes take the
      family's calls from this view.
    - ``judge(call, view)`` -> :class:`ModelCall`: the family's FlyDSL ``judge`` arguments for
      the call in ``view``, or a verdict decided without the rules (e.g. a GEMM in eager: FlyDSL's
      GEMM is an Inductor template). ``None``: the family has no FlyDSL verdict
      ("no FlyDSL path").
    - ``cost(call)`` -> ``(FLOPs, bytes)`` per call (``None``: one FLOP per output element, each
      tensor read or written once).
    - ``case(call, split)`` -> ``(shape text, note)`` in the family's catalogue syntax, or
      ``None`` when the call has no catalogue case (``flyexplore model --export-shapes``);
      ``split(rows, groups)`` divides routed rows over groups under the MoE routing assumption.
    - ``dims(call)`` -> the catalogue dims of the call (``{"m": .., "n": .., "k": ..}``), for
      matching published or measured cases by nearest shape; ``None`` when it has none.
    - ``matrix``: the modelled time uses the matrix-core peak of the call's dtype (else the
      FP32 vector peak).
    - ``keep_module(module)`` -> ``(name, args)`` or ``None``: a module the family keeps as one
      call named ``name`` when none of its inner calls is one of ``aten_ops`` (RMSNorm modules
      computed from pow/mean/rsqrt); ``args(module, inputs, inner_ops)`` -> ``((name, value)
      pairs, note)``, ``inner_ops`` the short names of the kernels it ran (``["mean", "mul"]``).
    - ``keep_function``: a torch function kept as one call (its inner ATen calls recorded as
      inner, not judged): ``(function(), name, args(args, kwargs) -> ((name, value), ...),
      scalars(args, kwargs) -> dict)``, ``function()`` a zero-argument callable returning the
      torch function (torch is imported only when capturing) (SDPA, whose math decomposition is
      not what a GPU runs).
    - ``output_layout(call_inputs, output)`` -> strides or ``None``: the strides a GPU kernel
      gives the kept function's output (SDPA: the query's dimension order), applied on a GPU
      device so that later calls see the layout a real run sees.
    """

    aten_ops: tuple[str, ...]
    view: str = "eager"
    judge: Callable | None = None
    cost: Callable | None = None
    case: Callable | None = None
    dims: Callable | None = None
    matrix: bool = False
    keep_module: Callable | None = None
    keep_function: tuple | None = None
    output_layout: Callable | None = None

    def __post_init__(self):
        if self.view not in MODEL_VIEWS:
            raise ValueError(f"unknown model view {self.view!r} (valid: {', '.join(MODEL_VIEWS)})")
        if not self.aten_ops and self.keep_function is None and self.keep_module is None:
            raise ValueError("ModelHooks needs aten_ops (the ATen overloads the family claims)")
        bad = [o for o in self.aten_ops if "." not in o]
        if bad:
            raise ValueError("ModelHooks.aten_ops names overloads as the dispatcher prints them "
                             f"(\"aten.mm.default\"), got {', '.join(map(repr, bad))}")


_DIMS = re.compile(r"^\d+(x\d+)*$")


@dataclass
class Operator:
    """An operator family: parameters, dtypes, inputs, reference, error metric, FLOP and byte
    counts, backends and suites.

    Subclass-free: an op module creates one ``Operator`` and fills the callables.
    ``dims`` are the ``x``-separated integer parameters of the shape text, in order;
    ``options`` are the other parameters with defaults, given after ``:`` as ``key=value``
    (a bare word is matched against ``choices``).
    """

    name: str
    doc: str
    dims: tuple[str, ...]
    options: dict[str, Any]
    dtypes: tuple[str, ...]
    make_inputs: Callable = None        # (case, dtype, device, seed) -> dict[str, Tensor]
    reference: Callable = None          # (case, dtype, inputs) -> Tensor (high precision)
    error: Callable = None              # (out, ref, case, dtype) -> error columns + accuracy_ok (ops/checks.py)
    flops: Callable = None              # (case) -> float
    bytes: Callable = None              # (case, dtype) -> float
    validate: Callable = None           # (params dict) -> None, raises UsageError
    choices: dict[str, tuple[str, ...]] = field(default_factory=dict)
    backends: dict[str, Backend] = field(default_factory=dict)
    suites: dict[str, Suite] = field(default_factory=dict)
    flydsl: FlyDSLPath | None = None    # how torch routes this family to FlyDSL (None: it does not)
    model: ModelHooks | None = None     # what it knows of a captured model step (None: nothing)
    published: tuple[PublishedSuite, ...] = ()   # its published MI355X tables (flyexplore.results.published)
    # every row on a GPU records what ran, not only FlyDSL rows: the kernel the library picked
    # is part of the answer (attention: which AOTriton backend -- Triton, aiter or FlyDSL)
    trace_on_gpu: bool = False
    # (case, dtype) -> iterable of TensorSize: what make_inputs allocates and one call returns,
    # in pure Python (the plan's int64 check and the sweep's memory estimate; None: neither)
    tensors: Callable = None
    # (case) -> (groups of dims, {param: value}): the dims a memory probe shrinks and grows (each
    # group's dims together; the other dims as in the case) and the params a probe sets
    # (flyexplore.run.memory.probe_cases; None: each dim alone, nothing set)
    memory_dims: Callable = None
    # (backend name, inputs) -> keywords of flyexplore.insight.breakdown.profile_step: every row of
    # the family gets a profiled breakdown of one call by kernel category (the model family; None: none)
    breakdown: Callable = None
    # the interleaved timing mode a GPU sweep of the family uses when none is asked for
    # (flyexplore.measure.modes; the model family: "event", a step's launch gaps are part of it)
    timing_mode: str | None = None
    # whether a recheck on fresh inputs applies (False: the inputs are not refilled in place)
    fresh_recheck: bool = True
    # (output) -> what a check across places compares (a tensor or nested tensors): a model step's
    # logits, never its whole output object (a KV cache does not cross a process boundary;
    # flyexplore.run.place.checked_tensors). None: the output's own tensors
    check_output: Callable = None
    # (case, dtype, inputs) -> {column: value}: row columns the inputs decide, added to every ok row
    # of the case (the model family: the bytes a decode step restores per call). None: none
    input_columns: Callable = None
    # (case, dtype) -> (bytes, terms text): a family that estimates a case's peak memory itself
    # (the model family: weights + KV cache + activations from the config); the sweep's memory check
    # (flyexplore.run.memory.memory_check) takes it in place of its probes (None: probes)
    memory: Callable = None

    # -- registration --------------------------------------------------------------------
    def backend(self, name: str, doc: str, *, available=None, context=None,
                source: str = "measured", baseline: bool = False):
        """Decorator registering ``build`` as backend ``name``. A duplicate name is an error."""
        def deco(build):
            if name in self.backends:
                raise ValueError(f"backend {name!r} registered twice for {self.name}")
            kw = {}
            if available is not None:
                kw["available"] = available
            if context is not None:
                kw["context"] = context
            self.backends[name] = Backend(name, build, doc, source=source, baseline=baseline, **kw)
            return build
        return deco

    def add_suite(self, name: str, shapes: Iterable[str | Mapping], dtypes: Iterable[str],
                  description: str, source: str) -> Suite:
        """Register a suite. ``shapes`` are shape texts, parameter dicts, or ``(shape, dtype)``
        pairs for suites whose cases each have their own dtype."""
        cases, pairs = [], []
        for s in shapes:
            dt = None
            if isinstance(s, tuple):
                s, dt = s
            c = self.case(s) if isinstance(s, str) else self.make_case(**s)
            if c not in cases:
                cases.append(c)
            if dt is not None:
                pairs.append((c, self.check_dtype(dt)))
        suite = Suite(name, self.name, tuple(cases), tuple(dtypes), description, source, tuple(pairs))
        if name in self.suites:
            raise ValueError(f"suite {name!r} registered twice for {self.name}")
        self.suites[name] = suite
        return suite

    # -- cases ---------------------------------------------------------------------------
    def make_case(self, **params) -> Case:
        """Build a validated :class:`Case` from keyword parameters (dims required, options
        defaulted). Raises :class:`UsageError` naming the bad value."""
        unknown = set(params) - set(self.dims) - set(self.options)
        if unknown:
            raise bad_choice(f"{self.name} parameter", sorted(unknown)[0], self.dims + tuple(self.options))
        vals: dict[str, Any] = {}
        for d in self.dims:
            if d not in params:
                raise UsageError(f"{self.name} case needs {d} (dims: {', '.join(self.dims)})")
            v = params[d]
            try:
                iv = int(v)
            except (TypeError, ValueError):
                raise UsageError(f"{self.name} {d} must be a positive integer, got {v!r}") from None
            if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()) or iv <= 0:
                raise UsageError(f"{self.name} {d} must be a positive integer, got {v!r}")
            if iv > INT64_MAX:
                raise UsageError(f"{self.name} {d}={iv} does not fit int64 (at most {INT64_MAX}): "
                                 "torch cannot index it")
            vals[d] = iv
        for k, default in self.options.items():
            v = params.get(k, default)
            if k in self.choices and v not in self.choices[k]:
                raise bad_choice(f"{self.name} {k}", v, self.choices[k])
            vals[k] = v
        if self.validate:
            self.validate(vals)
        label = "x".join(str(vals[d]) for d in self.dims)
        opts = [self._fmt_opt(k, vals[k]) for k in self.options if vals[k] != self.options[k]]
        if opts:
            label += ":" + ",".join(opts)
        return Case(self.name, tuple(vals.items()), label)

    def tensor_sizes(self, case: Case, dtype: str) -> tuple[TensorSize, ...]:
        """The tensors ``case`` allocates in ``dtype`` (the ``tensors`` hook; ``()`` without
        one), each checked: an element count past :data:`INT64_MAX` is a :class:`UsageError`
        naming the case, the dtype and the tensor, raised before anything allocates. Pure
        Python, no torch."""
        if self.tensors is None:
            return ()
        out = tuple(self.tensors(case, dtype))
        for t in out:
            if t.numel > INT64_MAX:
                raise UsageError(f"{self.name} shape {case.label} {dtype}: tensor {t.text()} has {t.numel} "
                                 f"elements, more than int64 holds ({INT64_MAX}); torch cannot allocate it")
        return out

    def _fmt_opt(self, k, v) -> str:
        if k in self.choices:
            return str(v)
        if isinstance(v, bool):
            return f"{k}={int(v)}"
        return f"{k}={v}"

    def case(self, text: str) -> Case:
        """Parse one shape text: ``"8x4096x4096"``, ``"8x4096x4096:NN"``, ``"2048x8192:eps=1e-5"``.

        Options after ``:``, comma-separated: ``key=value``; a boolean key alone (``causal``:
        ``causal=1``); a choice alone (``bwd``: ``pass=bwd``) or as a flag (``bwd=1``; ``bwd=0``:
        the other of two choices, ``pass=fwd``). Booleans take ``1/0``, ``true/false``, ``yes/no``,
        ``on/off``.

        Raises :class:`UsageError` for malformed or non-positive shapes, a dimension past int64
        (:data:`INT64_MAX`), an unknown option or a bad value, naming it.
        """
        text = text.strip()
        shape, _, opts = text.partition(":")
        shape = shape.strip().lower()
        if self.dims and re.match(rf"^{re.escape(self.dims[0])}\d", shape):
            shape = shape[len(self.dims[0]):]  # "g8x512x4096x4096": the first dimension named
        want = "x".join(d.upper() for d in self.dims)
        if not _DIMS.match(shape) or len(shape.split("x")) != len(self.dims):
            raise UsageError(f"malformed {self.name} shape {text!r} (expected {want}, "
                             f"positive integers, e.g. {'x'.join(['4096'] * len(self.dims))})")
        params: dict[str, Any] = dict(zip(self.dims, (int(x) for x in shape.split("x"))))
        for d, v in params.items():
            if v <= 0:
                raise UsageError(f"non-positive {self.name} {d}={v} in shape {text!r}")
            if v > INT64_MAX:
                raise UsageError(f"{self.name} {d}={v} in shape {text!r} does not fit int64 "
                                 f"(at most {INT64_MAX}): torch cannot index it")
        for tok in filter(None, (t.strip() for t in opts.split(","))):
            k, eq, v = (x.strip() for x in tok.partition("="))
            if eq and k in self.options:
                params[k] = _coerce(self.options[k], v, self.name, k)
                continue
            if not eq and isinstance(self.options.get(k), bool):
                params[k] = True   # a bare boolean key: "causal" is causal=1
                continue
            hit = self._choice_word(k)
            if hit is None:
                words = [c for ch in self.choices.values() for c in ch]
                if eq:
                    raise bad_choice(f"{self.name} option", k, [*self.options, *words])
                flags = [o for o, d in self.options.items() if isinstance(d, bool)]
                raise bad_choice(f"{self.name} option", k, [*words, *flags] or ["key=value"])
            opt, word = hit
            if eq and not _coerce(True, v, self.name, k):   # "bwd=0": the other of two choices
                others = [c for c in self.choices[opt] if c != word]
                if len(others) != 1:
                    raise UsageError(f"{self.name} option {tok!r} does not say which {opt} to take: give "
                                     f"{opt}=<one of {', '.join(others)}>")
                word = others[0]
            params[opt] = word
        return self.make_case(**params)

    def _choice_word(self, word: str) -> tuple[str, str] | None:
        """``(option, choice)`` for a word that is one of an option's ``choices`` (``"bwd"`` ->
        ``("pass", "bwd")``, ``"nt"`` -> ``("layout", "NT")``), else None."""
        for opt, ch in self.choices.items():
            for w in (word, word.upper()):
                if w in ch:
                    return opt, w
        return None

    def parse_shapes(self, text: str) -> tuple[Case, ...]:
        """``"4096x4096x4096;8x4096x4096"`` -> cases. Empty text is a :class:`UsageError`."""
        parts = [p for p in re.split(r"[;\n]", text) if p.strip()]
        if not parts:
            raise UsageError(f"no {self.name} shapes given")
        return tuple(self.case(p) for p in parts)

    def get_backend(self, name: str) -> Backend:
        if name not in self.backends:
            raise bad_choice(f"backend for {self.name}", name, self.backends)
        return self.backends[name]

    def get_suite(self, name: str) -> Suite:
        if name not in self.suites:
            raise bad_choice(f"suite for {self.name}", name, self.suites)
        return self.suites[name]

    def check_dtype(self, dtype: str) -> str:
        if dtype not in self.dtypes:
            raise bad_choice(f"dtype for {self.name}", dtype, self.dtypes)
        return dtype


def exported_shapes(model: str, op: str) -> list[tuple[str, str]]:
    """``(shape, dtype)`` of ``op`` in a built-in model's exported calls
    (``data/models/shapes/<model>.csv``, written by ``fx.model(...).shapes()``), each once, in file
    order, what-if variants left out: the cases of the ``hf-<model>`` suites."""
    import csv

    with open(model_shapes_dir() / f"{model}.csv", newline="", encoding="utf-8") as f:
        rows = [(r["shape"], r["dtype"]) for r in csv.DictReader(f) if r["op"] == op and not r.get("variant")]
    return list(dict.fromkeys(rows))


def _coerce(default, text: str, op: str, key: str):
    try:
        if isinstance(default, bool):
            if text.lower() in TRUE_WORDS:
                return True
            if text.lower() in FALSE_WORDS:
                return False
            raise ValueError
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float) or default is None:
            if text.lower() == "none":  # e.g. rmsnorm eps=None: torch's own default
                return None
            return float(text)
    except ValueError:
        want = "/".join(f"{t}/{f}" for t, f in zip(TRUE_WORDS, FALSE_WORDS)) if isinstance(default, bool) \
            else type(default).__name__
        raise UsageError(f"bad value {text!r} for {op} option {key} (expected {want})") from None
    return text


def relative_error(out, ref) -> dict[str, float]:
    """Error columns for a tensor result: ``err_rel`` = ||out - ref||_2 / ||ref||_2 and
    ``err_max_abs`` = max |out - ref|, both computed in float64 over the elements that are
    finite in both (NaN/Inf are judged by :func:`flyexplore.ops.checks.nonfinite_masks`)."""
    import torch

    o = out.double()
    r = ref.double()
    fin = torch.isfinite(o) & torch.isfinite(r)
    diff = torch.where(fin, o - r, torch.zeros_like(o))
    denom = float(torch.where(fin, r, torch.zeros_like(r)).norm())
    return {
        "err_rel": float(diff.norm()) / denom if denom > 0 else float(diff.norm()),
        "err_max_abs": float(diff.abs().max()) if diff.numel() else 0.0,
    }


#: Default tolerances on the global ``err_rel`` per dtype (output-precision rounding plus
#: accumulation-order differences). Operators check each element or row as well
#: (:mod:`flyexplore.ops.checks`); scaled GEMMs judge against the dequantized product instead.
ERR_TOL = {"fp32": 1e-4, "fp16": 5e-3, "bf16": 2e-2, "fp64": 1e-10,
           "fp8_e4m3": 1e-1, "fp8_e5m2": 2e-1, "mxfp8": 1e-1, "mxfp4": 3e-1}


def reset_dynamo() -> None:
    """Reset Dynamo (``torch._dynamo.reset()``) so that the next case compiles anew. The sweep
    and :func:`flyexplore.insight.case_trace.trace_case` call it once per case, before any backend of the
    case is built: with interleaved timing several compiled backends of one case live side by
    side, so a reset per backend (or per round) would recompile the others. A process that has
    not imported Dynamo has compiled nothing: there is nothing to reset, and Dynamo is not
    imported for it (1.6 CPU-s that an eager-only worker never needs)."""
    import sys

    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()


def compile_context(_ctx, _case):
    """``Backend.context`` for compile backends: nothing to switch at call time (the compile
    options are given to ``torch.compile`` by the backend's build; Dynamo is reset per case by
    :func:`reset_dynamo`)."""
    return contextlib.nullcontext()


def tensor_bytes(t) -> float:
    """Bytes of a :class:`~flyexplore.world.conditions.TensorDesc` (``None``: 0): elements x
    element size (4 when the dtype has no ``itemsize``)."""
    if t is None:
        return 0.0
    n = 1
    for s in t.shape:
        n *= s
    return float(n) * (t.dtype.itemsize if hasattr(t.dtype, "itemsize") else 4)


def io_bytes(call) -> float:
    """Bytes a captured call reads and writes, each tensor once (:func:`tensor_bytes` of its
    inputs and outputs): the byte count of the model hooks' ``cost``."""
    return sum(tensor_bytes(t) for t in call.inputs) + sum(tensor_bytes(t) for t in call.outputs)


def rows_of(t) -> int | None:
    """The rows of a row-wise operand: the product of every dim but the last of a
    :class:`~flyexplore.world.conditions.TensorDesc` (``None`` for a missing or 0-D one)."""
    if t is None or not t.ndim:
        return None
    m = 1
    for s in t.shape[:-1]:
        m *= s
    return m
