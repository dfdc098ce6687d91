"""What an environment of an A/B gets (issue 45): only what its text gives -- none of the driver's
variables that change what Python imports, not the driver's working folder -- so that
``--worker-code env`` runs the environment's own flyexplore; a probe that quotes what a bad
interpreter printed; and a thread-count A/B on the CPU, which cannot see its change, refused
before anything starts."""
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import flyexplore as fx
from conftest import ROOT
from flyexplore._version import __version__
from flyexplore.cli import main
from flyexplore.errors import UsageError
from flyexplore.run import envs as E
from flyexplore.run.journal import journal_path
from flyexplore.run.spec import SweepSpec


def _fake_flyexplore(where: Path, version: str = "0.0.9") -> None:
    pkg = where / "flyexplore"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from flyexplore._version import __version__\n")
    (pkg / "_version.py").write_text(f"__version__ = {version!r}\n")


def _old_env(where: Path) -> str:
    """A venv holding flyexplore 0.0.9 in its own site-packages (as an environment with an old
    flyexplore installed has), and this interpreter's torch and numpy through a plain path line
    in a ``.pth`` (which does not run the ``.pth`` files there: this checkout's editable install
    stays out). Returns its interpreter."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    py = where / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    _fake_flyexplore(Path(site))
    Path(site, "parent.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return str(py)


def _version_seen(py: str, env: dict, cwd) -> str:
    code = "import flyexplore._version as v; print(v.__version__)"
    return subprocess.run([py, "-c", code], env=env, cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


# -- the driver's import variables stay out ----------------------------------------------------------

def test_the_worker_gets_none_of_the_drivers_import_variables_unless_its_environment_sets_them(monkeypatch):
    for k in E.IMPORT_VARS:
        monkeypatch.setenv(k, f"/driver/{k}")
    monkeypatch.setenv("HOME", "/h")
    for code in E.WORKER_CODE:
        env = E.worker_environ(E.parse_env("b"), code)    # reads os.environ
        assert env["HOME"] == "/h"
        for k in E.IMPORT_VARS:
            assert f"/driver/{k}" not in env.get(k, ""), (code, k, env.get(k))
        assert env["PYTHONSAFEPATH"] == "1"               # the working folder stays off sys.path
        assert ("PYTHONPATH" in env) == (code == "driver")
        for k in E.IMPORT_VARS:                           # the environment's own value is kept
            got = E.worker_environ(E.parse_env(f"b:{k}=/mine"), code)
            if k == "PYTHONPATH" and code == "driver":
                lead, own = got[k].split(os.pathsep)
                assert os.listdir(lead) == ["flyexplore"] and own == "/mine"
            else:
                assert got[k] == "/mine", (code, k)
    assert "PYTHONSAFEPATH" not in E.worker_environ(E.parse_env("b:-PYTHONSAFEPATH"), "env")
    got = E.worker_environ(E.parse_env("b:PYTHONPATH=/mine"), "driver", ["/extra"])
    assert got["PYTHONPATH"].split(os.pathsep)[1:] == ["/extra", "/mine"]


def test_worker_code_env_runs_the_environments_own_flyexplore_and_an_old_one_is_refused(tmp_path, monkeypatch):
    """Issue 45, 1: with the driver's PYTHONPATH at the checkout (as with PYTHONPATH=<the checkout>),
    an environment holding flyexplore 0.0.9 ran as the driver's version. Now the probe runs with
    the worker's variables and names 0.0.9; the A/B is refused before anything runs."""
    py = _old_env(tmp_path / "old")
    leaky = dict(os.environ, PYTHONPATH=str(ROOT))
    assert _version_seen(py, leaky, tmp_path) == __version__        # the leak this guards against
    assert _version_seen(py, {k: v for k, v in leaky.items() if k != "PYTHONPATH"}, tmp_path) == "0.0.9"
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    old = E.parse_env(f"old={py}")
    assert E.worker_environ(old, "env").get("PYTHONPATH") is None
    for cwd in (tmp_path, ROOT):     # the checkout as working folder does not win either
        monkeypatch.chdir(cwd)
        with pytest.raises(UsageError) as ei:
            E.probe(old, "env")
        assert "flyexplore 0.0.9" in str(ei.value) and f"the driver runs {__version__}" in str(ei.value)
    with pytest.raises(UsageError, match=r"env 'old' .*: flyexplore 0\.0\.9 at .*the driver runs") as ei:
        SweepSpec("gemm", device="cpu", shapes="64x64x64", dtypes="fp32", envs=["base", f"old={py}"],
                  worker_code="env", out=tmp_path / "r.parquet")
    assert "\n" not in str(ei.value) and not (tmp_path / "r.parquet").exists()
    assert E.probe(E.parse_env("base"), "env")["flyexplore"] == __version__   # the driver's own: fine


def test_an_environments_own_pythonpath_is_what_it_imports(tmp_path, monkeypatch):
    """The environment's text may give a PYTHONPATH (``NAME:PYTHONPATH=/x``): that one, not the
    driver's, leads the search."""
    _fake_flyexplore(tmp_path / "fake")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.chdir(ROOT)
    with pytest.raises(UsageError, match=r"flyexplore 0\.0\.9 at .*fake/flyexplore"):
        E.probe(E.parse_env(f"old:PYTHONPATH={tmp_path / 'fake'}"), "env")


def test_the_drivers_interpreter_without_torch_hints_at_the_pythonpath_not_passed(tmp_path, monkeypatch):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "v")], check=True)
    bare = str(tmp_path / "v" / "bin" / "python")
    monkeypatch.setattr(sys, "executable", bare)    # a driver whose own interpreter finds torch only on its PYTHONPATH
    monkeypatch.setenv("PYTHONPATH", "/opt/torch-here")
    with pytest.raises(UsageError) as ei:
        E.probe(E.parse_env("me"))
    msg = str(ei.value)
    assert "no torch there" in msg and "the driver's PYTHONPATH (/opt/torch-here) is not passed" in msg
    assert "--env me:PYTHONPATH=/opt/torch-here" in msg and "\n" not in msg
    with pytest.raises(UsageError) as ei:                   # given in the environment: no hint
        E.probe(E.parse_env("me:PYTHONPATH=/nowhere"))
    assert "no torch there" in str(ei.value) and "not passed" not in str(ei.value)
    monkeypatch.delenv("PYTHONPATH")
    with pytest.raises(UsageError) as ei:                   # no PYTHONPATH in the driver: no hint
        E.probe(E.parse_env("me"))
    assert "not passed" not in str(ei.value)


# -- a bad interpreter's output quoted ------------------------------------------------------------------

def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_an_interpreter_that_prints_something_else_is_quoted_with_its_exit_code(tmp_path):
    """Issue 45, 2: a garbage interpreter that printed two lines was reported as
    ``(exit 0: no output)``."""
    two = _script(tmp_path / "two", "echo 'I am not python'\necho 'second line'\nexit 0\n")
    with pytest.raises(UsageError) as ei:
        E.probe(E.parse_env(f"g={two}"))
    msg = str(ei.value)
    assert msg.startswith(f"env 'g' ({two}): the interpreter does not run flyexplore's check")
    assert "exit 0" in msg and "I am not python | second line" in msg and "no output" not in msg
    assert "\n" not in msg
    long = _script(tmp_path / "long", f"echo {'x' * 1000}\nexit 0\n")
    with pytest.raises(UsageError) as ei:
        E.probe(E.parse_env(f"g={long}"))
    assert "x" * E.SAID_CHARS in str(ei.value) and "x" * (E.SAID_CHARS + 1) not in str(ei.value)
    err = _script(tmp_path / "err", "echo 'early' >&2\necho 'boom: bad thing' >&2\nexit 3\n")
    with pytest.raises(UsageError, match=r"exit 3; nothing on stdout, stderr ends: 'boom: bad thing'"):
        E.probe(E.parse_env(f"g={err}"))
    mute = _script(tmp_path / "mute", "exit 0\n")
    with pytest.raises(UsageError, match=r"exit 0; it printed nothing"):
        E.probe(E.parse_env(f"g={mute}"))


# -- thread counts on the CPU --------------------------------------------------------------------------

def test_the_thread_rule_compares_what_each_worker_would_have(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    same = E.check_envs(["a:OMP_NUM_THREADS=1", "b:OMP_NUM_THREADS=1,X=2"])
    assert E.thread_refusal(same, "cpu") is None                      # one value everywhere: allowed
    differ = E.check_envs(["a:MKL_NUM_THREADS=1", "b:MKL_NUM_THREADS=4"])
    why = E.thread_refusal(differ, "cpu")
    assert "env 'a' MKL_NUM_THREADS=1, env 'b' MKL_NUM_THREADS=4" in why and "\n" not in why
    assert E.thread_refusal(differ, "cuda") is None                   # a GPU: nothing changes
    half = E.check_envs(["a", "b:OMP_NUM_THREADS=2"])
    assert "env 'a' OMP_NUM_THREADS unset" in E.thread_refusal(half, "cpu")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")                      # what a inherits: the same
    assert E.thread_refusal(half, "cpu") is None
    assert "env 'b' OMP_NUM_THREADS unset" in E.thread_refusal(E.check_envs(["a", "b:-OMP_NUM_THREADS"]), "cpu")
    assert E.thread_refusal(E.check_envs(["a", "b:X=1"]), "cpu") is None


def test_a_thread_count_ab_on_the_cpu_is_refused_before_anything_starts(tmp_path, capsys):
    """Issue 45, 3: ``OMP_NUM_THREADS`` 1 vs 2 read 1.006x AMBIGUOUS and said nothing. Now the API
    and the command line refuse it in the same one line, before any probe or file; the second
    environment's interpreter does not even exist, and is never looked at."""
    out = tmp_path / "F.parquet"
    envs = ["a:OMP_NUM_THREADS=1", f"b={tmp_path / 'no' / 'python'}:OMP_NUM_THREADS=2"]
    with pytest.raises(UsageError) as ei:
        fx.sweep("gemm", shapes="64x64x64", dtypes="fp32", device="cpu", envs=envs, out=out)
    msg = str(ei.value)
    assert "env 'a' OMP_NUM_THREADS=1, env 'b' OMP_NUM_THREADS=2" in msg and "share one core" in msg
    assert "--timing cpu-wall" in msg and "flyexplore compare" in msg and "\n" not in msg
    rc = main(["sweep", "--op", "gemm", "--shapes", "64x64x64", "--dtypes", "fp32", "--device", "cpu",
               "--env", envs[0], "--env", envs[1], "--out", str(out)])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and err == [f"flyexplore: error: {msg}"]
    assert not out.exists() and not journal_path(out).exists() and sorted(os.listdir(tmp_path)) == []
