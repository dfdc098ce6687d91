"""The kernel X-ray's disk cache (flyexplore.insight.xray_cache): the same X-ray again reads what
the compile-only worker returned before instead of starting it, with the same numbers and ISA;
anything the compile depends on changes the key; a damaged entry or a cache turned off is never an
error."""
import json
import os
import subprocess

import pytest

from flyexplore.cache import entry_path
from flyexplore.insight import xray as X
from flyexplore.insight import xray_cache as XC

CASE = ("rmsnorm", "8192x4096", "bf16")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache of this test's own (the session's is shared by every test)."""
    monkeypatch.setenv("FLYEXPLORE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "xray"


def _record(tmp_path, text="\t.text\n"):
    isa = tmp_path / "k_final_isa.s"
    isa.write_text(text)
    return {"eligible": True, "reason": "ok", "predicate": "p", "notes": [],
            "kernels": [{"family": "rmsnorm fwd", "config": {"N": 4096}, "error": None, "compile_s": 0.2,
                         "isa": [str(isa)], "dump_dir": str(tmp_path), "reused": False}]}


@pytest.mark.slow
def test_the_same_xray_again_is_read_from_the_cache_without_the_worker(cache, tmp_path, monkeypatch):
    """One real compile; the second X-ray of the case starts no process and gives the same
    kernel (resources, occupancy, instructions, ISA text, saved .s file), marked cached."""
    first = X.xray(*CASE, out=str(tmp_path / "a"))
    assert first.error is None and first.kernels and not any(k.cached for k in first.kernels), first.to_text()
    assert len(list(cache.glob("*.json"))) == 1

    real_run = subprocess.run

    def no_worker(cmd, *a, **kw):
        if X._WORKER in cmd:
            raise AssertionError(f"the X-ray worker started: {cmd}")
        return real_run(cmd, *a, **kw)   # the linker's version check

    monkeypatch.setattr(X.subprocess, "run", no_worker)
    again = X.xray(*CASE, out=str(tmp_path / "b"))
    (k1,), (k2,) = first.kernels, again.kernels
    assert k2.cached and not k2.reused and "read from the X-ray cache" in again.to_text()
    assert (k2.name, k2.family, k2.config, k2.resources, k2.occupancy, k2.instructions, k2.compile_s) == \
           (k1.name, k1.family, k1.config, k1.resources, k1.occupancy, k1.instructions, k1.compile_s)
    assert k2.isa_text == k1.isa_text and open(k2.isa_file).read() == k1.isa_text
    assert os.path.dirname(k2.isa_file) == again.out_dir and again.versions == first.versions
    assert (again.eligible, again.reason, again.verdict_source) == (first.eligible, first.reason, first.verdict_source)
    assert X.xray_frame([again])["cached"].tolist() == [True]
    # not read: a batch keeping the IR, or cache=False (the worker would start)
    for kw in ({"keep_ir": True}, {"cache": False}):
        with pytest.raises(AssertionError, match="the X-ray worker started"):
            X.xray(*CASE, **kw)


def test_what_the_compile_depends_on_is_in_the_key(tmp_path):
    job = {"op": "rmsnorm", "builder": "flyexplore.ops.rmsnorm.xray:build", "params": {"m": 8192, "n": 4096},
           "dtype": "bf16", "torch_dtype": "bfloat16", "autotune": False, "verdict": None}
    lld = tmp_path / "ld.lld"
    lld.write_text("x")
    tools = XC.toolchain(str(lld), None)
    assert set(tools) == {"torch", "flydsl", "lld", "device_libs", "worker", "xray_kit"}
    assert tools["torch"].startswith("2.15") and str(lld) in tools["lld"]
    key = XC.entry_key("gfx950", job, tools)
    assert key == XC.entry_key("gfx950", dict(job), dict(tools))
    others = [XC.entry_key("gfx942", job, tools), XC.entry_key("gfx950", {**job, "dtype": "fp16"}, tools),
              XC.entry_key("gfx950", {**job, "autotune": True}, tools),
              XC.entry_key("gfx950", {**job, "params": {"m": 8192, "n": 8192}}, tools),
              XC.entry_key("gfx950", job, {**tools, "flydsl": "0.3.9"}),
              XC.entry_key("gfx950", job, {**tools, "torch": "2.16.0"})]
    lld.write_text("another linker")
    os.utime(lld, ns=(1, 1))
    others.append(XC.entry_key("gfx950", job, XC.toolchain(str(lld), None)))
    assert key not in others and len(set(others)) == len(others)


def test_a_damaged_entry_a_failed_record_or_no_cache_is_never_an_error(cache, tmp_path, monkeypatch):
    rec = _record(tmp_path)
    assert XC.store("k1", rec, {"torch": "2.15.0"})
    got, versions = XC.load("k1", str(tmp_path / "scratch"))
    assert versions == {"torch": "2.15.0"} and got["kernels"][0]["cached"]
    assert open(got["kernels"][0]["isa"][0]).read() == "\t.text\n"
    entry = entry_path("xray", "k1")
    assert entry.parent == cache and entry.is_file()
    entry.write_text("{not json")
    assert XC.load("k1", str(tmp_path / "scratch")) is None
    entry.write_text(json.dumps({"v": XC.CACHE_VERSION + 1}))
    assert XC.load("k1", str(tmp_path / "scratch")) is None
    bad = {**rec, "kernels": [{**rec["kernels"][0], "error": "RuntimeError: no"}]}
    assert not XC.store("k2", bad, {}) and not XC.store("k3", {**rec, "eligible": False}, {})
    assert not entry_path("xray", "k2").exists()
    monkeypatch.setenv("FLYEXPLORE_CACHE", "off")
    assert not XC.store("k4", rec, {}) and XC.load("k1", str(tmp_path)) is None


def test_a_cache_that_cannot_be_written_is_skipped(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("FLYEXPLORE_CACHE", str(blocker))    # a file where the folder would go
    assert not XC.store("k", _record(tmp_path), {})
    assert blocker.is_file() and blocker.read_text() == ""
