"""Issue 22 (plans): a plan cannot double rows (repeats folded, with a note), cannot overflow
(a dimension or tensor past int64 is a one-line usage error when the plan is made) and cannot
blow the memory (a case estimated over the device's free memory or ``max_memory`` becomes a
``refused`` row, an exit 2 when every case is): :func:`flyexplore.run.plan.make_plan`,
:func:`~flyexplore.run.plan.shapes_file_plan`, :func:`flyexplore.run.cases.case_memory` and
:func:`~flyexplore.run.cases.memory_refusals`, :func:`flyexplore.measure.devstate.free_memory`."""
from __future__ import annotations

import json
import sys
import types

import pytest

torch = pytest.importorskip("torch")

from flyexplore.cli import main  # noqa: E402
from flyexplore.errors import UsageError  # noqa: E402
from flyexplore.measure import devstate as DS  # noqa: E402
from flyexplore.measure.timing import MIN_FLUSH_BYTES  # noqa: E402
from flyexplore.ops import get_op  # noqa: E402
from flyexplore.ops.base import INT64_MAX  # noqa: E402
from flyexplore.results import table as R  # noqa: E402
from flyexplore.run import cases as C  # noqa: E402
from flyexplore.run import memory as M  # noqa: E402
from flyexplore.run.plan import make_plan, shapes_file_plan  # noqa: E402
from flyexplore.run.spec import SweepSpec  # noqa: E402

HUGE_GEMM = "1000000000x1000000000x1000000000"           # 10^9 cubed: 4e18 B per fp32 operand


def _fake(free, source="fake reader"):
    return lambda device: (free, source)


# -- duplicates ------------------------------------------------------------------------------------

def test_repeated_shapes_dtypes_and_backends_are_folded_with_a_note():
    p = make_plan("gemm", shapes="64x64x64;64x64x64", dtypes="fp32", backends="aten")
    assert [(c.label, d) for c, d in p.pairs] == [("64x64x64", "fp32")] and len(p) == 1
    assert p.notes == ("1 duplicate entry folded (first kept): 64x64x64 fp32 (x2)",)
    p = make_plan("gemm", shapes="64x64x64", dtypes="fp32,fp32,bf16", backends="aten,inductor,aten")
    assert [(c.label, d) for c, d in p.pairs] == [("64x64x64", "fp32"), ("64x64x64", "bf16")]
    assert p.backends == ("aten", "inductor")
    assert p.notes == ("1 duplicate entry folded (first kept): 64x64x64 fp32 (x2)",
                       "1 duplicate backend entry folded (first kept): aten (x2)")
    # two spellings of one case (NT is gemm's default layout) are one case; the first is kept
    p = make_plan("gemm", shapes="64x64x64:NT;32x32x32;64x64x64", dtypes="fp32")
    assert [c.label for c, _ in p.pairs] == ["64x64x64", "32x32x32"]
    assert "64x64x64 fp32 (x2)" in p.notes[0]
    assert make_plan("gemm", shapes="64x64x64;32x32x32", dtypes="fp32,bf16").notes == ()


def test_a_fold_note_counts_every_dropped_entry_and_names_at_most_five():
    shapes = ";".join(f"{8 * i}x8x8" for i in range(1, 8))
    p = make_plan("gemm", shapes=shapes + ";" + shapes + ";8x8x8", dtypes="fp32")
    assert len(p.pairs) == 7
    note, = p.notes
    assert note.startswith("8 duplicate entries folded (first kept): 8x8x8 fp32 (x3), 16x8x8 fp32 (x2)")
    assert note.endswith(", and 2 more") and note.count("(x") == 5


def test_a_suite_with_a_repeated_dtype_gives_each_pair_once():
    once = make_plan("rmsnorm", suite="cpu-small", dtypes="fp32")
    twice = make_plan("rmsnorm", suite="cpu-small", dtypes="fp32,fp32")
    assert twice.pairs == once.pairs and twice.notes and not once.notes


def test_a_shapes_file_with_a_repeated_dtype_counts_each_use_once(tmp_path):
    f = tmp_path / "s.csv"
    f.write_text("op,shape,dtype,count,model,phase,module\n"
                 "gemm,64x64x64,bf16,2,m,prefill,a.q\ngemm,64x64x64,bf16,3,m,prefill,a.k\n"
                 "gemm,32x64x64,bf16,1,m,decode,a.o\n")
    once = shapes_file_plan("gemm", f, ["fp32"], ["aten"])
    twice = shapes_file_plan("gemm", f, ["fp32", "fp32"], ["aten", "aten"])
    assert twice.pairs == once.pairs and len(once.pairs) == 2
    assert twice.meta == once.meta
    assert once.meta[("64x64x64", "fp32")]["model_count"] == 5       # two modules' uses, each once
    assert len(json.loads(twice.meta[("64x64x64", "fp32")]["model_uses"])) == 2
    assert twice.notes == ("1 duplicate dtype entry folded (first kept): fp32 (x2)",
                           "1 duplicate backend entry folded (first kept): aten (x2)")
    assert once.notes == ()


@pytest.mark.slow
def test_a_sweep_of_repeated_entries_writes_each_row_once(tmp_path, capsys):
    out = tmp_path / "r.csv"
    rc = main(["sweep", "--op", "gemm", "--shapes", "8x8x8;8x8x8", "--dtypes", "fp32,fp32", "--backends",
               "aten,aten", "--rep", "3", "--warmup", "1", "--out", str(out)])
    assert rc == 0
    err = capsys.readouterr().err
    # two shapes x two dtypes: 4 entries of one (case, dtype), 3 folded; the backend once
    assert "flyexplore: note: 3 duplicate entries folded (first kept): 8x8x8 fp32 (x4)\n" in err, err
    assert "flyexplore: note: 1 duplicate backend entry folded (first kept): aten (x2)\n" in err, err
    df = R.load(out)
    R.validate(df)                                      # the check that rejected the doubled file
    assert list(zip(df["case"], df["dtype"], df["backend"])) == [("8x8x8", "fp32", "aten")]


# -- overflow ------------------------------------------------------------------------------------

@pytest.mark.parametrize("op,shape,needle", [
    ("gemm", f"{10 ** 20}x1x1", f"gemm m={10 ** 20} in shape '{10 ** 20}x1x1' does not fit int64"),
    ("gemm", f"1x1x{INT64_MAX + 1}", "gemm k=9223372036854775808"),
    ("rmsnorm", f"8x{10 ** 19}", "rmsnorm n=10000000000000000000"),
    ("grouped_gemm", f"{10 ** 30}x8x8x8", "grouped_gemm g="),
])
def test_a_dimension_past_int64_is_a_usage_error_naming_the_shape(op, shape, needle):
    with pytest.raises(UsageError, match=needle):
        make_plan(op, shapes=shape)
    with pytest.raises(UsageError, match="does not fit int64"):
        get_op(op).make_case(**dict(zip(get_op(op).dims, [int(x) for x in shape.split("x")])))


@pytest.mark.parametrize("op,shape,dtype,tensor", [
    ("gemm", "4000000000x4000000000x1", "fp32", "out [4000000000, 4000000000]"),
    ("gemm", "1x4000000000x4000000000:NT", "bf16", "b [4000000000, 4000000000]"),
    ("rmsnorm", "4000000000x4000000000", "bf16", "x [4000000000, 4000000000]"),
    ("topk", "4000000000x4000000000x1", "fp32", "x [4000000000, 4000000000]"),
    ("scaled_gemm", "1x4000000000x4000000000", "mxfp8", "b_hp [4000000000, 4000000000]"),
    ("attention", "100000x100000x100000x1x100000", "bf16", "q [100000, 100000, 100000, 100000]"),
    ("grouped_gemm", "4x1000000x100000x100000000000000", "bf16", "a [4000000, 100000000000000]"),
    ("grouped_gemm", "4x1000x100000000000000x100000:NT", "bf16", "b [4, 100000000000000, 100000]"),
])
def test_a_tensor_past_int64_elements_is_a_usage_error_when_the_plan_is_made(op, shape, dtype, tensor):
    with pytest.raises(UsageError) as e:
        make_plan(op, shapes=shape, dtypes=dtype)
    msg = str(e.value)
    assert f"tensor {tensor}" in msg and "more than int64 holds" in msg and "\n" not in msg
    assert get_op(op).case(shape).label in msg and dtype in msg


def test_grouped_rows_past_the_int32_offsets_are_refused():
    with pytest.raises(UsageError, match="total rows 4000000000 .* int32 offsets"):
        make_plan("grouped_gemm", shapes="2x2000000000x64x64")
    with pytest.raises(UsageError, match="total rows 2147483648"):
        make_plan("grouped_gemm", shapes="2x2147483647x64x64:ms=2147483647/1")
    make_plan("grouped_gemm", shapes="2x2147483646x64x64:ms=2147483646/1")   # 2^31 - 1 rows: fits


def test_the_sweep_command_refuses_an_overflowing_shape_with_one_line_and_no_file(tmp_path, capsys):
    out = tmp_path / "r.csv"
    rc = main(["sweep", "--op", "gemm", "--shapes", f"{10 ** 20}x8x8", "--backends", "aten", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "does not fit int64" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []                # no result file, no journal: a later run is free
    with pytest.raises(UsageError, match="does not fit int64"):
        SweepSpec("gemm", shapes=f"8x8x{10 ** 20}", device="cpu")


# -- the memory estimate --------------------------------------------------------------------------

def test_case_memory_counts_inputs_one_output_and_the_flush_buffer():
    g = get_op("gemm")
    c = g.case("64x32x16")
    assert C.case_memory_terms(g, c, "fp32") == {"inputs": (64 * 16 + 16 * 32) * 4, "output": 64 * 32 * 4,
                                                 "flush buffer": MIN_FLUSH_BYTES}
    assert C.case_memory(g, c, "bf16", flush_bytes=0) == (64 * 16 + 16 * 32 + 64 * 32) * 2
    gg = get_op("grouped_gemm")
    rag = gg.case("4x96x128x256:ms=0/96/32/64")        # 192 rows in all; B of every group allocated
    assert C.case_memory_terms(gg, rag, "bf16", flush_bytes=0) == {
        "inputs": 192 * 256 * 2 + 4 * 256 * 128 * 2 + 4 * 4, "output": 192 * 128 * 2}
    rms = get_op("rmsnorm")
    assert C.case_memory(rms, rms.case("8x4096"), "bf16", flush_bytes=0) == (2 * 8 * 4096 + 4096) * 2
    assert C.case_memory(rms, rms.case("8x4096:weight=0"), "bf16", flush_bytes=0) == 2 * 8 * 4096 * 2
    # exact past int64 (a Python int): 10^9 cubed in fp32 is 8e18 B of inputs and 4e18 B of output
    assert C.case_memory(g, g.case(HUGE_GEMM), "fp32", flush_bytes=0) == 12 * 10 ** 18


def _storage_bytes(t) -> int:
    return t.untyped_storage().nbytes()


@pytest.mark.parametrize("op,shape,dtype", [
    ("gemm", "48x40x24:TN", "fp32"), ("gemm", "48x40x24:NT", "bf16"),
    ("grouped_gemm", "4x96x128x256:ms=0/96/32/64", "fp32"), ("grouped_gemm", "8x32x256x128:NT", "bf16"),
    ("rmsnorm", "16x256", "bf16"), ("rmsnorm", "16x256:weight=0", "fp32"),
    ("topk", "16x512x8", "fp32"), ("scaled_gemm", "16x64x128", "mxfp8"), ("scaled_gemm", "16x64x128", "mxfp4"),
    ("scaled_gemm", "16x64x128:scaling=row", "fp8_e4m3"), ("scaled_gemm", "16x64x128:scaling=tensor", "fp8_e4m3"),
    ("attention", "2x4x16x32x64:hkv=2", "fp32"),
])
def test_the_estimate_is_what_make_inputs_and_a_call_really_allocate(op, shape, dtype):
    """Each operator's ``tensors`` hook against the tensors its ``make_inputs`` builds (names,
    storage bytes) and against the aten backend's output on the CPU."""
    o = get_op(op)
    case = o.case(shape)
    sizes = o.tensor_sizes(case, dtype)
    inputs = o.make_inputs(case, dtype, torch.device("cpu"), 0)
    real = {k: v for k, v in inputs.items() if torch.is_tensor(v)}
    declared = {t.name: t for t in sizes if t.role == "input"}
    assert set(declared) == set(real)
    for name, t in real.items():
        assert (_storage_bytes(t), t.numel(), t.element_size()) == (declared[name].nbytes, declared[name].numel,
                                                                    declared[name].itemsize), name
    from flyexplore.ops.base import RunContext
    from flyexplore.world import env as ENV

    bk = o.get_backend("aten" if "aten" in o.backends else "math")
    ctx = RunContext(torch.device("cpu"), ENV.collect())
    if bk.available(ctx, case, dtype):
        return
    with bk.context(ctx, case):
        got = bk.build(case, dtype, inputs, ctx)()
    outs = [got] if torch.is_tensor(got) else [t for t in got if torch.is_tensor(t)]
    assert sum(t.numel() * t.element_size() for t in outs) == sum(t.nbytes for t in sizes if t.role == "output")


def test_an_attention_backward_counts_the_held_forward_output_and_the_three_gradients():
    a = get_op("attention")
    sizes = {t.name: (t.role, t.shape) for t in a.tensor_sizes(a.case("2x8x16x32x64:hkv=2,bwd"), "bf16")}
    assert sizes == {"q": ("input", (2, 8, 16, 64)), "k": ("input", (2, 2, 32, 64)), "v": ("input", (2, 2, 32, 64)),
                     "do": ("input", (2, 8, 16, 64)), "o": ("output", (2, 8, 16, 64)),
                     "dq": ("output", (2, 8, 16, 64)), "dk": ("output", (2, 2, 32, 64)),
                     "dv": ("output", (2, 2, 32, 64)), "scores": ("work", (2, 8, 16, 32))}


def test_an_operator_without_tensor_sizes_is_estimated_by_its_byte_count():
    from flyexplore.ops.base import Operator

    op = Operator("sized", "y = x", dims=("n",), options={}, dtypes=("fp32",))
    op.bytes = lambda c, d: 8.0 * c["n"]
    assert C.case_memory_terms(op, op.case("1000"), "fp32", flush_bytes=0) == {"inputs and output": 8000}
    op.bytes = None
    assert C.case_memory(op, op.case("1000"), "fp32", flush_bytes=0) == 0


# -- refusals --------------------------------------------------------------------------------------

@pytest.fixture
def no_fits(monkeypatch, tmp_path):
    """An empty fit cache: with ``measure=False`` these checks read cached fits only, and a fit that
    another test (or an earlier run on this machine) left in the user's cache would change them."""
    monkeypatch.setenv("FLYEXPLORE_CACHE", str(tmp_path / "fits"))


def test_cases_over_the_free_memory_are_refused_with_their_estimate(no_fits):
    plan = make_plan("gemm", shapes="8x8x8;1024x1024x1024", dtypes="fp32")   # 768 B and 12.6 MB
    got = C.memory_refusals(plan, "cpu", reader=_fake(10 ** 6), measure=False)
    assert list(got) == [("1024x1024x1024", "fp32")]
    assert got[("1024x1024x1024", "fp32")] == ("estimated memory 1.3e7 B (inputs 8.4e6 B, output 4.2e6 B; its tensors alone, a "
                                               "lower bound) is over "
                                               "the device's free memory 1.0 MB (fake reader)")
    assert C.memory_refusals(plan, "cpu", reader=_fake(10 ** 9), measure=False) == {}


def test_the_smaller_of_max_memory_and_the_free_memory_is_the_limit(no_fits):
    plan = make_plan("gemm", shapes="8x8x8;1024x1024x1024", dtypes="fp32")
    by_max = C.memory_refusals(plan, "cpu", max_memory=10 ** 6, reader=_fake(10 ** 9), measure=False)
    assert by_max[("1024x1024x1024", "fp32")].endswith("is over max_memory (--max-memory) 1.0 MB")
    by_free = C.memory_refusals(plan, "cpu", max_memory=10 ** 9, reader=_fake(2 * 10 ** 6), measure=False)
    assert by_free[("1024x1024x1024", "fp32")].endswith("is over the device's free memory 2.0 MB (fake reader)")
    # the free memory unread: max_memory alone; neither: nothing refused
    assert list(C.memory_refusals(plan, "cpu", max_memory=10 ** 6, reader=_fake(None, "not read"), measure=False)) == [
        ("1024x1024x1024", "fp32")]
    assert C.memory_refusals(plan, "cpu", reader=_fake(None, "not read")) == {}
    for bad in (0, -5, 1.5, True, "1e9"):
        with pytest.raises(UsageError, match="max_memory must be a number of bytes >= 1"):
            C.memory_refusals(plan, "cpu", max_memory=bad, reader=_fake(None))


def test_a_plan_whose_every_case_is_over_is_a_usage_error_naming_the_smallest(no_fits):
    plan = make_plan("gemm", shapes="2048x2048x2048;1024x1024x1024", dtypes="fp32")
    with pytest.raises(UsageError) as e:
        C.memory_refusals(plan, "cpu", max_memory=10 ** 6, reader=_fake(None))
    assert str(e.value) == ("every case of the plan is over the memory limit: the smallest, 1024x1024x1024 fp32, "
                            "is estimated at 1.3e7 B (inputs 8.4e6 B, output 4.2e6 B; its tensors alone, a lower "
                            "bound), over max_memory (--max-memory) 1.0 MB")


def test_a_gpu_case_counts_the_devices_flush_buffer(monkeypatch):
    monkeypatch.setattr(M, "flush_bytes_for", lambda dev: 123_456_789)
    plan = make_plan("gemm", shapes="8x8x8;1024x1024x1024", dtypes="fp32")
    got = C.memory_refusals(plan, "cuda:0", reader=_fake(13 * 10 ** 7), measure=False)    # 8x8x8 + flush: 1.23e8 B
    assert got == {("1024x1024x1024", "fp32"): "estimated memory 1.4e8 B (inputs 8.4e6 B, output 4.2e6 B, flush "
                                               "buffer 1.2e8 B; its tensors alone, a lower bound) is over the device's "
                                               "free memory 130.0 MB (fake reader)"}

    def unreadable(dev):
        raise RuntimeError("no GPU")

    monkeypatch.setattr(M, "flush_bytes_for", unreadable)       # the smallest GPU flush, 256 MiB
    got = C.memory_refusals(plan, "cuda:0", reader=_fake(275 * 10 ** 6), measure=False)    # 2.68e8 B and 2.81e8 B
    assert list(got) == [("1024x1024x1024", "fp32")] and "flush buffer 2.7e8 B" in got[("1024x1024x1024", "fp32")]


@pytest.mark.parametrize("op,shapes,dtype", [
    ("gemm", f"64x64x64;{HUGE_GEMM}", "fp32"),
    ("grouped_gemm", "4x64x128x128;64x10000000x1000000x1000000:ms=" + "/".join(["10000000"] * 63 + ["0"]), "bf16"),
    ("rmsnorm", "64x64;1000000000x1000000000", "fp32"),
])
def test_real_small_and_huge_cases_on_this_cpu(op, shapes, dtype):
    """The real free-memory reader of this machine: the small case runs, the huge one (over
    10^15 bytes, more than any machine has) is refused."""
    free, source = DS.free_memory("cpu")
    assert free is not None and free > 0, source
    plan = make_plan(op, shapes=shapes, dtypes=dtype)
    huge = plan.pairs[1][0].label
    got = C.memory_refusals(plan, "cpu", measure=False)
    assert list(got) == [(huge, dtype)]                  # the small case is not refused
    assert got[(huge, dtype)].startswith("estimated memory ") and "free memory" in got[(huge, dtype)]
    assert C.case_memory(plan.op, plan.pairs[1][0], dtype) > 10 ** 15
    with pytest.raises(UsageError, match=f"the smallest, {huge} {dtype}"):
        C.memory_refusals(make_plan(op, shapes=huge, dtypes=dtype), "cpu")


@pytest.mark.slow
def test_a_sweep_gives_a_huge_case_a_refused_row_and_runs_the_rest(tmp_path, capsys):
    out = tmp_path / "r.csv"
    rc = main(["sweep", "--op", "gemm", "--shapes", f"{HUGE_GEMM};8x8x8", "--dtypes", "fp32", "--backends", "aten",
               "--rep", "3", "--warmup", "1", "--out", str(out)])
    assert rc == 0
    df = R.load(out)
    R.validate(df)
    rows = dict(zip(df["case"], zip(df["status"], df["message"])))
    assert rows["8x8x8"][0] == "ok"
    assert rows[HUGE_GEMM][0] == "refused" and rows[HUGE_GEMM][1].startswith("estimated memory 1.2e19 B")
    rc = main(["sweep", "--op", "gemm", "--shapes", HUGE_GEMM, "--dtypes", "fp32", "--backends", "aten",
               "--out", str(tmp_path / "s.csv")])
    err = capsys.readouterr().err
    assert rc == 2 and "every case of the plan is over the memory limit" in err and "Traceback" not in err
    assert not (tmp_path / "s.csv").exists()


# -- the free-memory readers -----------------------------------------------------------------------

def test_the_cpu_reader_takes_mem_available_else_psutil(tmp_path, monkeypatch):
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       32000000 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n")
    assert DS.cpu_free_memory(str(f)) == (20000000 * 1024, "MemAvailable, /proc/meminfo")
    monkeypatch.setitem(sys.modules, "psutil", types.SimpleNamespace(
        virtual_memory=lambda: types.SimpleNamespace(available=12345)))
    assert DS.cpu_free_memory(str(tmp_path / "none")) == (12345, "psutil.virtual_memory().available")
    monkeypatch.setitem(sys.modules, "psutil", None)           # not installed
    assert DS.cpu_free_memory(str(tmp_path / "none"))[0] is None


def _props(**kw):
    return types.SimpleNamespace(**kw)


def test_the_nvidia_reader_asks_nvml_by_uuid_and_never_creates_a_context(monkeypatch):
    calls = []

    class NVMLError(Exception):
        pass

    nvml = types.SimpleNamespace(
        NVMLError=NVMLError, nvmlInit=lambda: calls.append("init"), nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetHandleByUUID=lambda u: calls.append(("uuid", u)) or "h1",
        nvmlDeviceGetHandleByIndex=lambda i: calls.append(("index", i)) or "h0",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(free={"h1": 7 * 10 ** 10, "h0": 1}[h]))
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: _props(uuid="4e7c61bb-d2ff"))

    def context(*a, **k):
        raise AssertionError("torch.cuda.mem_get_info creates a CUDA context")

    monkeypatch.setattr(torch.cuda, "mem_get_info", context)
    assert DS.free_memory("cuda:1") == (7 * 10 ** 10, "NVML nvmlDeviceGetMemoryInfo")
    assert calls == ["init", ("uuid", "GPU-4e7c61bb-d2ff"), "shutdown"]
    def unknown(uuid):
        raise NVMLError("not found")

    nvml.nvmlDeviceGetHandleByUUID = unknown                    # e.g. a MIG slice: by index then
    assert DS.free_memory("cuda:1")[0] == 1 and ("index", 1) in calls
    monkeypatch.setitem(sys.modules, "pynvml", None)           # no nvidia-ml-py: not read
    free, why = DS.free_memory("cuda")
    assert free is None and why.startswith("not read")


def test_the_rocm_reader_asks_amdsmi_by_bus_id_else_torch(monkeypatch):
    vram = object()
    smi = types.SimpleNamespace(
        amdsmi_init=lambda: None, amdsmi_shut_down=lambda: None, amdsmi_get_processor_handles=lambda: ["g0", "g1"],
        amdsmi_get_gpu_device_bdf=lambda h: {"g0": "0000:05:00.0", "g1": "0000:65:00.0"}[h],
        AmdSmiMemoryType=types.SimpleNamespace(VRAM=vram),
        amdsmi_get_gpu_memory_total=lambda h, t: 288 * 10 ** 9 if t is vram else 0,
        amdsmi_get_gpu_memory_usage=lambda h, t: {"g0": 1, "g1": 8 * 10 ** 9}[h])
    monkeypatch.setitem(sys.modules, "amdsmi", smi)
    monkeypatch.setattr(torch.version, "hip", "7.0.0")
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: _props(pci_domain_id=0, pci_bus_id=0x65, pci_device_id=0))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (42, 100))
    assert DS.free_memory("cuda:0") == (280 * 10 ** 9, "amdsmi VRAM total - used")
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    assert DS.free_memory("cuda:0") == (42, "torch.cuda.mem_get_info")


def test_the_reader_of_this_cpu_and_of_an_unknown_device_type():
    free, source = DS.free_memory("cpu")
    assert isinstance(free, int) and free > 0 and source
    assert DS.free_memory("meta")[0] is None
    assert DS.free_memory("no-such-device")[0] is None
