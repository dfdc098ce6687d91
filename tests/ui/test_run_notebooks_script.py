"""benchmarks' run_notebooks script: ``--only NAME`` re-runs one notebook and keeps the other
notebooks' entries of ``run.json`` (issue 36: it overwrote them). The notebooks are not run
here: the executor is replaced by one that writes the copy."""
import importlib.util
import json

import pytest

from flyexplore.ui import notebooks as N

from conftest import ROOT


def _script():
    path = ROOT / "benchmarks" / "tools" / "run_notebooks.py"
    spec = importlib.util.spec_from_file_location("run_notebooks_script", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def script(monkeypatch):
    ran = []

    def execute(path, dest, parameters=None, cwd=None, timeout=None, slim=True):
        ran.append(path.stem)
        dest.write_text(path.read_text())
        if path.stem == "export_report":
            raise RuntimeError("a cell failed")

    monkeypatch.setattr(N, "execute", execute)   # the real environment report: env.json as written
    mod = _script()
    mod.ran = ran
    return mod


def test_merge_keeps_other_entries_replaces_the_rerun_one_in_notebook_order():
    mod = _script()
    old = [{"notebook": "a.ipynb", "status": "ok"}, {"notebook": "b.ipynb", "status": "failed"},
           {"notebook": "gone.ipynb", "status": "ok"}]
    new = [{"notebook": "b.ipynb", "status": "ok"}]
    assert mod.merge_runs(old, new, ["a.ipynb", "b.ipynb", "c.ipynb"]) == [
        {"notebook": "a.ipynb", "status": "ok"}, {"notebook": "b.ipynb", "status": "ok"},
        {"notebook": "gone.ipynb", "status": "ok"}]
    assert mod.merge_runs({"not": "a list"}, new, ["b.ipynb"]) == new
    assert mod.merge_runs([{"no": "notebook key"}], new, ["b.ipynb"]) == new


def test_only_merges_into_run_json(script, tmp_path, capsys):
    names = [p.name for p in N.list_notebooks()]
    assert script.main([str(tmp_path), "--only", "quickstart"]) == 0
    assert [r["notebook"] for r in json.loads((tmp_path / "run.json").read_text())] == ["quickstart.ipynb"]
    assert json.loads((tmp_path / "env.json").read_text())["provenance"]["flyexplore"]
    assert script.main([str(tmp_path), "--only", "export_report"]) == 1   # a failed one is kept too
    runs = json.loads((tmp_path / "run.json").read_text())
    assert [r["notebook"] for r in runs] == [n for n in names if n in ("quickstart.ipynb", "export_report.ipynb")]
    assert {r["notebook"]: r["status"] for r in runs} == {"quickstart.ipynb": "ok", "export_report.ipynb": "failed"}
    first = runs[[r["notebook"] for r in runs].index("quickstart.ipynb")]
    assert script.main([str(tmp_path), "--only", "quickstart"]) == 0   # re-run: replaced, not doubled
    again = json.loads((tmp_path / "run.json").read_text())
    assert [r["notebook"] for r in again] == [r["notebook"] for r in runs]
    assert again[[r["notebook"] for r in again].index("export_report.ipynb")]["status"] == "failed"
    assert first["notebook"] == "quickstart.ipynb" and script.ran == ["quickstart", "export_report", "quickstart"]
    # a damaged run.json is said and written anew
    (tmp_path / "run.json").write_text("{not json")
    assert script.main([str(tmp_path), "--only", "quickstart"]) == 0
    assert "unreadable" in capsys.readouterr().err
    assert [r["notebook"] for r in json.loads((tmp_path / "run.json").read_text())] == ["quickstart.ipynb"]
