"""README's commands: CI runs README's test command (pip's ``-q`` aside), and the fast lane
README names is the one pyproject.toml's ``slow`` marker makes."""
from __future__ import annotations

import re
import tomllib

from conftest import ROOT


def _commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Two commands on a fresh machine", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", section, re.S)


def test_ci_runs_the_readmes_test_command_unchanged():
    demo, tests = _commands()[:2]
    assert demo.endswith(".venv/bin/flyexplore demo") and tests.endswith(".venv/bin/python -m pytest")
    ci = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln and not ln.startswith("#")]
    assert ci[-1].replace("pip install -q ", "pip install ") == tests, (ci[-1], tests)


def test_the_fast_lane_is_documented_and_its_marker_registered():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Two commands on a fresh machine", 1)[1].split("\n## ", 1)[0]
    assert '.venv/bin/python -m pytest -m "not slow"' in section
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert any(m.startswith("slow:") for m in ini["markers"]) and "--strict-markers" in ini["addopts"]
