"""Which code made a number (issue 36): flyexplore's git commit and tree state
(:func:`flyexplore.world.env.git_commit`, :func:`~flyexplore.world.env.git_dirty`), their
stand-ins for a copy without ``.git`` (``FLYEXPLORE_COMMIT``, ``FLYEXPLORE_DIRTY``), the
environment report and result rows that carry them, and a benchmark output's
:func:`~flyexplore.world.env.provenance`."""
from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess

import pytest

from conftest import ROOT
from flyexplore.results import table as R
from flyexplore.world import env as E

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(repo, *args) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], "HOME": str(repo),
                               "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
                               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """A git repository with one commit of ``a.txt``."""
    r = tmp_path / "repo"
    r.mkdir()
    _git(r, "init", "-q")
    (r / "a.txt").write_text("one\n")
    _git(r, "add", "a.txt")
    _git(r, "commit", "-q", "-m", "first")
    E._git_state.cache_clear()
    yield r
    E._git_state.cache_clear()


@needs_git
def test_commit_and_tree_state_of_a_repository(repo):
    head = _git(repo, "rev-parse", "HEAD")
    assert len(head) == 40
    assert E.git_commit(repo, environ={}) == head
    assert E.git_dirty(repo, environ={}) == "clean"
    (repo / "out.csv").write_text("an untracked output\n")   # untracked files do not count
    E._git_state.cache_clear()
    assert E.git_dirty(repo, environ={}) == "clean"
    (repo / "a.txt").write_text("two\n")                       # a tracked file changed
    assert E.git_dirty(repo, environ={}) == "clean"            # cached: the first answer stays
    E._git_state.cache_clear()
    assert E.git_dirty(repo, environ={}) == "dirty"
    assert E.git_commit(repo, environ={}) == head
    _git(repo, "commit", "-q", "-am", "second")
    E._git_state.cache_clear()
    assert E.git_commit(repo, environ={}) == _git(repo, "rev-parse", "HEAD") != head
    assert E.git_dirty(repo, environ={}) == "clean"


@needs_git
def test_environment_variables_stand_in_for_git(repo):
    head = _git(repo, "rev-parse", "HEAD")
    given = {"FLYEXPLORE_COMMIT": " 0123abc \n"}
    assert E.git_commit(repo, environ=given) == "0123abc" != head
    assert E.git_dirty(repo, environ=given) == ""              # the commit is not this tree's: unknown
    for flag, want in (("1", "dirty"), ("TRUE", "dirty"), ("yes", "dirty"), ("dirty", "dirty"),
                       ("0", "clean"), ("false", "clean"), ("No", "clean"), ("clean", "clean"),
                       ("maybe", "")):
        assert E.git_dirty(repo, environ={**given, "FLYEXPLORE_DIRTY": flag}) == want, flag
    assert E.git_commit(repo, environ={"FLYEXPLORE_COMMIT": ""}) == head   # empty: not set
    assert E.git_dirty(repo, environ={"FLYEXPLORE_DIRTY": "1"}) == "dirty"  # the flag alone overrides git


def test_no_repository_and_no_git_read_as_unknown(tmp_path, monkeypatch):
    E._git_state.cache_clear()
    plain = tmp_path / "plain"
    plain.mkdir()
    assert (E.git_commit(plain, environ={}), E.git_dirty(plain, environ={})) == ("", "")
    assert E.git_commit(tmp_path / "missing", environ={}) == ""
    monkeypatch.setenv("PATH", str(tmp_path))                  # no git program at all
    E._git_state.cache_clear()
    assert (E.git_commit(ROOT, environ={}), E.git_dirty(ROOT, environ={})) == ("", "")
    E._git_state.cache_clear()


@needs_git
def test_a_folder_inside_another_repository_is_not_read_as_its_checkout(repo):
    # an installed copy (site-packages) inside some other repository's folder must not take its commit
    inner = repo / "venv" / "site-packages"
    inner.mkdir(parents=True)
    assert (E.git_commit(inner, environ={}), E.git_dirty(inner, environ={})) == ("", "")


@needs_git
def test_this_checkout_names_its_head():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    E._git_state.cache_clear()
    head = _git(ROOT, "rev-parse", "HEAD")
    assert os.path.realpath(E.package_root()) == os.path.realpath(ROOT)
    assert E.git_commit(environ={}) == head
    assert E.git_dirty(environ={}) in ("clean", "dirty")


def test_commit_label_and_text():
    assert E.commit_label("abc", "clean") == "abc"
    assert E.commit_label("abc", "dirty") == "abc-dirty"
    assert E.commit_label("abc", "") == "abc-dirty?"
    assert E.commit_label("", "dirty") == ""
    assert E.commit_text("abc", "dirty") == "abc (tracked files changed since)"
    assert "FLYEXPLORE_COMMIT" in E.commit_text("", "")


def test_the_environment_report_carries_the_commit():
    e = E.collect(refresh=True, environ={"FLYEXPLORE_COMMIT": "c0ffee", "FLYEXPLORE_DIRTY": "1"})
    assert (e.flyexplore_commit, e.flyexplore_dirty) == ("c0ffee", "dirty")
    assert e.code_columns() == {"flyexplore": e.versions["flyexplore"], "flyexplore_commit": "c0ffee-dirty"}
    d = e.to_dict()
    assert d["flyexplore_commit"] == "c0ffee" and d["flyexplore_dirty"] == "dirty"
    assert "flyexplore commit: c0ffee (tracked files changed since)" in e.to_text().splitlines()
    other = E.collect(refresh=True, environ={"FLYEXPLORE_COMMIT": "beef", "FLYEXPLORE_DIRTY": "0"})
    assert other.code_columns()["flyexplore_commit"] == "beef"
    assert other.fingerprint() == e.fingerprint()   # env_id names the environment, not the code


def test_the_cli_env_prints_the_commit(cli):
    p = cli("env", "--json", env={"FLYEXPLORE_COMMIT": "feedface", "FLYEXPLORE_DIRTY": "no"})
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert (d["flyexplore_commit"], d["flyexplore_dirty"]) == ("feedface", "clean")


def test_every_row_of_a_sweep_carries_the_commit(tmp_path, monkeypatch):
    from flyexplore.run import sweep as SW
    from flyexplore.run.spec import SweepSpec

    env = E.collect(refresh=True, environ={"FLYEXPLORE_COMMIT": "5ca1ab1e", "FLYEXPLORE_DIRTY": "true"})
    monkeypatch.setattr(E, "collect", lambda *a, **k: env)   # the sweep reads the environment through the module
    out = tmp_path / "r.csv"
    df = SW.run_sweep(SweepSpec("gemm", shapes="8x8x8;16x8x8", dtypes="fp32", backends="aten", device="cpu",
                                out=out, timer={"rep": 3, "warmup": 1}), progress=False)
    assert len(df) == 2 and (df["flyexplore_commit"] == "5ca1ab1e-dirty").all()
    back = R.load(out, validated=True)
    assert (back["flyexplore_commit"] == "5ca1ab1e-dirty").all()
    assert list(R.COLUMNS).index("flyexplore_commit") == list(R.COLUMNS).index("flyexplore") + 1


def test_files_written_before_the_column_still_load(tmp_path):
    old = R.load(ROOT / "data" / "h200" / "demo" / "results.csv")   # written before the column
    assert len(old) and old["flyexplore_commit"].isna().all()
    d = old.drop(columns=["flyexplore_commit"])
    R.save(d, tmp_path / "old.parquet")
    again = R.load(tmp_path / "old.parquet", validated=True)
    assert again["flyexplore_commit"].isna().all() and str(again["flyexplore_commit"].dtype) == "string"


def test_provenance_names_commit_version_and_machine_but_no_host(tmp_path):
    env = E.collect(refresh=True)
    p = E.provenance("benchmarks/evidence/torture.py", env,
                     environ={"FLYEXPLORE_COMMIT": "abc123", "FLYEXPLORE_DIRTY": "0"})
    assert p["script"] == "benchmarks/evidence/torture.py"
    assert (p["flyexplore_commit"], p["flyexplore_dirty"], p["commit_from"]) == ("abc123", "clean", "FLYEXPLORE_COMMIT")
    assert p["flyexplore"] == env.versions["flyexplore"]
    assert p["platform"] == env.platform and p["device"] == env.device.name
    assert p["cpu_count"] >= 1 and p["cpu"] and p["python"] == platform.python_version()
    assert p["device_count"] == (len(env.devices) if env.platform != "cpu" else 0)
    assert "host" not in p and platform.node() not in p.values()
    assert p["utc"].endswith("Z") and len(p["utc"]) == 20
    mine = E.provenance("s", env, environ={})   # this checkout's git, or nothing; never the variable
    assert mine["commit_from"] == ("git" if mine["flyexplore_commit"] else "")
    line = E.provenance_line(p)
    assert line.startswith("provenance: ") and "\n" not in line
    assert json.loads(line.split(": ", 1)[1]) == p


def test_write_provenance_and_env_json(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYEXPLORE_COMMIT", "d00d")
    monkeypatch.delenv("FLYEXPLORE_DIRTY", raising=False)
    env = E.collect(refresh=True)
    got = E.write_provenance(tmp_path / "new" / "folder", "benchmarks/gpu/gpu_trace.py", env)
    on_disk = json.loads((tmp_path / "new" / "folder" / "provenance.json").read_text())
    assert on_disk == got and got["flyexplore_commit"] == "d00d" and got["flyexplore_dirty"] == ""
    d = json.loads(E.env_json("benchmarks/gpu/gpu_trace.py", env))
    assert d["provenance"]["script"] == "benchmarks/gpu/gpu_trace.py" and d["fingerprint"] == env.fingerprint()
    assert d["flyexplore_commit"] == "d00d"
