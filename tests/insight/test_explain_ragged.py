"""Issue 22 (explain): a ragged grouped GEMM is judged on the A the sweep passes, [total_M, K]
(the sum of the group sizes), not on G x M rows; ``flyexplore explain`` prints the ragged note
that the sweep's explanations (:func:`flyexplore.insight.explain.explain_case`) carry. Judged in
the CPU's gfx950 predicate mode of ``tests/ops/test_explain_agreement.py`` (FakeTensors, torch
2.15's own Inductor predicate), as the explainer tests do."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from flyexplore.cli import main  # noqa: E402
from flyexplore.insight import explain as E  # noqa: E402
from flyexplore.ops import get_op  # noqa: E402
from tests.ops import test_explain_agreement as A  # noqa: E402

#: the agreement tests' gfx950 predicate mode: FLYDSL_GPU_ARCH=gfx950 with torch's arch caches
#: cleared, FakeTensors claiming cuda:0, Inductor graph inputs under a GraphLowering handler
gfx950, fake_mode, inductor_harness, _ir_input = A.gfx950, A.fake_mode, A.inductor_harness, A._ir_input

#: 64 groups, every row in group 0: A [65536, 4096] as the sweep passes it; G x M would be
#: [4194304, 4096] (34 GB of bf16, past the 32-bit buffer span).
MS = "/".join(["65536"] + ["0"] * 63)
RAGGED = f"64x65536x4096x4096:ms={MS}"


def _failed(ex):
    return {c.name for c in ex.conditions if c.ok is False}


def test_a_ragged_grouped_gemm_is_judged_on_the_rows_the_sweep_passes():
    ex = E.explain_text("grouped_gemm", RAGGED, "bf16")                # gfx950, as on a ROCm torch 2.15
    assert ex.taken and _failed(ex) == set()
    assert ex.arguments["a"] == "bf16[65536, 4096]" and ex.arguments["b"] == "bf16[64, 4096, 4096]"
    ragged = [n for n in ex.notes if n.startswith("ragged groups")]
    assert len(ragged) == 1                                          # once, not once per front door
    assert "judged on A [65536, 4096]" in ragged[0] and "1 of 64 groups non-empty" in ragged[0]
    # the sweep's own explanation of the case (explain_case, what a flydsl row's reason comes from)
    case = get_op("grouped_gemm").case(RAGGED)
    sweep = E.explain_case("grouped_gemm", case, "bf16", env=E.facts(arch="gfx950", assume_rocm=True),
                           compile_options=E.compile_options_for("grouped_gemm", None))
    assert sweep.call_ok and sweep.arguments["a"] == ex.arguments["a"]
    assert [n for n in sweep.notes if n.startswith("ragged groups")] == ragged
    # a uniform case: G x M rows, and no ragged note
    uni = E.explain_text("grouped_gemm", "8x512x4096x4096", "bf16")
    assert uni.arguments["a"] == "bf16[4096, 4096]" and not any(n.startswith("ragged") for n in uni.notes)


@pytest.mark.parametrize("shape", ["4x96x128x256:ms=0/96/32/64", "3x40x64x32:ms=40/0/7,layout=NT", "8x32x256x128:NT"])
def test_the_explainer_describes_the_tensors_make_inputs_builds(shape):
    op = get_op("grouped_gemm")
    case = op.case(shape)
    call = E.describe("grouped_gemm", shape, "bf16")
    real = op.make_inputs(case, "bf16", torch.device("cpu"), 0)
    for name in ("a", "b"):
        assert tuple(call[name].shape) == tuple(real[name].shape), name
        assert tuple(call[name].stride) == tuple(real[name].stride()), name
    assert tuple(call["offs"].shape) == tuple(real["offs"].shape) and call["offs"].dtype == real["offs"].dtype


def test_the_explain_command_prints_the_verdict_on_the_real_a_and_the_ragged_note(capsys):
    rc = main(["explain", "--op", "grouped_gemm", "--shape", RAGGED, "--dtype", "bf16", "--assume-rocm",
               "--arch", "gfx950"])
    out = capsys.readouterr().out
    assert rc == 0 and "grouped_gemm: FlyDSL YES" in out
    assert "arguments: a=bf16[65536, 4096], b=bf16[64, 4096, 4096]" in out
    assert "[NO ]" not in out
    notes = [ln for ln in out.splitlines() if ln.startswith("note: ragged groups")]
    assert len(notes) == 1 and "judged on A [65536, 4096]" in notes[0]


def test_torch_agrees_the_real_a_qualifies_and_g_times_m_rows_would_not(gfx950, fake_mode):
    """torch 2.15's use_flydsl_grouped_mm_template on A [65536, 4096] says yes, as the explainer
    does; on the G x M = 4194304 rows the explainer used to judge, it says no."""
    import torch._inductor.kernel.mm_grouped as GM
    from torch._inductor import ir

    call = E.describe("grouped_gemm", RAGGED, "bf16")
    ex = E.explain("grouped_gemm", env=E.facts(arch="gfx950", assume_rocm=True,
                                               compile_options=E.compile_options_for("grouped_gemm", None)), **call)
    assert ex.call_ok

    def torch_says(a, b):
        with inductor_harness() as g:
            layout = ir.FixedLayout(torch.device("cuda", 0), torch.bfloat16, [a.shape[0], b.shape[2]], [b.shape[2], 1])
            na, nb = _ir_input(g, fake_mode, a), _ir_input(g, fake_mode, b)
            no = _ir_input(g, fake_mode, E.TensorDesc((b.shape[0],), torch.int32))
            return bool(GM.use_flydsl_grouped_mm_template(na, nb, layout, True, False, no, None, True, False)
                        and GM.get_flydsl_grouped_mm_template_kwargs(na, nb))

    a, b = call["a"], call["b"]
    assert tuple(a.shape) == (65536, 4096)
    assert torch_says(a, b) is True
    assert torch_says(E.TensorDesc((64 * 65536, 4096), torch.bfloat16), b) is False
