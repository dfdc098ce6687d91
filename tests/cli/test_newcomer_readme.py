"""Issue 36, a newcomer working from the README alone: what the terminal says (demo verdicts,
the synthetic example's A/B), shapes typed as ``flyexplore explain --help`` shows them."""
import pytest

from flyexplore.cli import main
from flyexplore.cli._shared import EXIT_NO, EXIT_USAGE


@pytest.mark.parametrize("shape,want", [
    ("1x32x4096x4096x128:causal=1,bwd", "pass=bwd"),     # as --help shows it
    ("1x32x4096x4096x128:causal=1,bwd=1", "pass=bwd"),
    ("1x32x4096x4096x128:causal=1,bwd=0", "pass=fwd"),
    ("1x32x4096x4096x128:causal,bwd", "pass=bwd"),
])
def test_explain_takes_boolean_words_as_help_shows_them(capsys, shape, want):
    rc = main(["explain", "--op", "attention", "--shape", shape, "--dtype", "bf16"])
    out = capsys.readouterr().out
    assert rc == EXIT_NO and want in out   # a CUDA/CPU torch: not eligible, but the call was read


def test_explain_names_a_bad_boolean_value_in_one_line(capsys):
    rc = main(["explain", "--op", "attention", "--shape", "1x32x4096x4096x128:bwd=2", "--dtype", "bf16"])
    err = capsys.readouterr().err
    assert rc == EXIT_USAGE
    assert err == ("flyexplore: error: bad value '2' for attention option bwd "
                   "(expected 1/0/true/false/yes/no/on/off)\n")
