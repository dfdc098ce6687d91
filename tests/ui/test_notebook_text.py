"""What the walkthrough notebooks say, checked statically (nothing runs): the shell commands
they show parse with the real CLI and do what the text around them says, and what they say
about CPU timings is what flyexplore.measure does."""
import json
import re
import shlex

import pytest

from flyexplore.cli import build_parser
from flyexplore.measure import modes as M
from flyexplore.ui import notebooks as N

NOTEBOOKS = N.list_notebooks()


def _markdown(path) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
            if c["cell_type"] == "markdown"]


def shell_commands(path) -> list[list[str]]:
    """The ``flyexplore ...`` commands of a notebook's fenced shell blocks, as argv lists
    (without ``flyexplore``): continuation lines joined, ``# ...`` comments and ``$(...)``
    substitutions (read as one word) left out."""
    out = []
    for md in _markdown(path):
        for block in re.findall(r"```(?:bash|sh|shell)?\n(.*?)```", md, re.S):
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                line = re.sub(r"\$\([^)]*\)", "PY", re.split(r"\s#\s", line)[0]).strip()
                if line.startswith("flyexplore "):
                    out.append(shlex.split(line)[1:])
    return out


def test_the_notebooks_show_shell_commands():
    assert sum(len(shell_commands(p)) for p in NOTEBOOKS) >= 5


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_shell_commands_parse_and_do_what_the_text_says(path):
    cmds = shell_commands(path)
    for argv in cmds:
        try:
            build_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"{path.name}: `flyexplore {shlex.join(argv)}` does not parse")
    # issue 36: the text said to sweep with --trace while the commands left it out
    if any("`--trace`" in md for md in _markdown(path)):
        sweeps = [a for a in cmds if a[:1] == ["sweep"]]
        assert sweeps and all("--trace" in a for a in sweeps), \
            f"{path.name} says --trace; its sweep commands: {[shlex.join(a) for a in sweeps]}"


def test_cpu_timings_are_called_what_they_are():
    # issue 36: the quickstart called CPU timings wall-clock; the CPU's default is thread time
    auto = next(m for m in M.TABLE if m.name == "auto")
    cpu = next(m for m in M.TABLE if m.name == "cpu-thread")
    assert "cpu-thread on the CPU" in auto.meaning and cpu.meaning.startswith("time.thread_time")
    for path in NOTEBOOKS:
        text = " ".join(" ".join(_markdown(path)).split())
        assert not re.search(r"wall[- ]clock", text, re.I), f"{path.name} calls timings wall-clock"
    quick = " ".join(" ".join(_markdown(next(p for p in NOTEBOOKS if p.stem == "quickstart"))).split())
    assert "thread's CPU time (`time.thread_time`" in quick
