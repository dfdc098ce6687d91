"""What README promises: its two commands (the first installs what every main job needs, the second
is the one CI runs, pip's ``-q`` aside), the fast lane whose marker pyproject.toml registers, a
tour whose commands exist, links into ``docs/`` that resolve, and a landing page of at most 150
lines (the reference lives in the docs site: tests/test_docs_site.py)."""
from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from conftest import ROOT

README = Path(ROOT) / "README.md"
TWO_COMMANDS = "## Two commands on a fresh machine"


def _section(heading: str) -> str:
    text = README.read_text()
    assert heading in text, heading
    return text.split(heading, 1)[1].split("\n## ", 1)[0]


def _commands() -> list[str]:
    return re.findall(r"```bash\n(.*?)\n```", _section(TWO_COMMANDS), re.S)


def test_readme_is_a_landing_page_of_at_most_150_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, len(lines)
    # the file tree lives in docs/architecture.md only
    assert not re.search(r"^\s+__init__\.py\s", README.read_text(), re.M)


def test_the_first_command_installs_what_every_main_job_needs_then_runs_the_demo():
    demo = _commands()[0]
    assert demo == ('python3 -m venv .venv && .venv/bin/pip install -r requirements.txt -e ".[models]" '
                    '&& .venv/bin/flyexplore demo'), demo
    extras = tomllib.loads((Path(ROOT) / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    # `flyexplore model` needs transformers: the extra the first command installs has it
    assert any(d.startswith("transformers") for d in extras["models"]), extras["models"]


def test_ci_runs_the_readmes_test_command_unchanged():
    tests = _commands()[1]
    assert tests == ('python3 -m venv .venv && .venv/bin/pip install -r requirements.txt -e ".[test]" '
                     '&& .venv/bin/python -m pytest -n 3 --dist worksteal'), tests
    ci = [ln for ln in (Path(ROOT) / ".ci" / "run").read_text().splitlines() if ln and not ln.startswith("#")]
    assert ci[-1].replace("pip install -q ", "pip install ") == tests, (ci[-1], tests)


def test_the_fast_lane_is_documented_and_its_marker_registered():
    section = _section(TWO_COMMANDS)
    assert '.venv/bin/python -m pytest -m "not slow" -n 2' in section
    assert re.search(r"On 2 CPU cores at rest the fast lane takes \d+ min \d+ s and the full suite "
                     r"\d+ min \d+ s \(measured\s+\d{4}-\d\d-\d\d", section), "the suite's measured times"
    ini = tomllib.loads((Path(ROOT) / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert any(m.startswith("slow:") for m in ini["markers"]) and "--strict-markers" in ini["addopts"]


def _doc_links(text: str) -> list[str]:
    return re.findall(r"\]\((docs/[^)#\s]+)(?:#[^)\s]*)?\)", text)


def test_every_docs_link_in_readme_exists():
    links = _doc_links(README.read_text())
    assert len(links) >= 10, links  # the picture and a link per topic
    missing = [ln for ln in links if not (Path(ROOT) / ln).is_file()]
    assert not missing, missing


def test_the_link_check_catches_a_missing_page():
    assert _doc_links("see [x](docs/no-such-page.md#a) and ![p](docs/demo-report.png)") == \
        ["docs/no-such-page.md", "docs/demo-report.png"]
    assert not (Path(ROOT) / "docs" / "no-such-page.md").exists()


def test_every_command_of_the_tour_is_a_flyexplore_subcommand():
    tour = _section("## A tour of the main jobs")
    named = set(re.findall(r"^flyexplore (\w+)", tour, re.M))
    assert {"sweep", "explain", "model", "compare", "report"} <= named, named
    assert "notebooks/quickstart.ipynb" in tour and (Path(ROOT) / "notebooks" / "quickstart.ipynb").is_file()
    out = subprocess.run([sys.executable, "-m", "flyexplore", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    listed = set(re.search(r"\{([a-z,]+)\}", out.stdout).group(1).split(","))
    assert named <= listed, sorted(named - listed)
