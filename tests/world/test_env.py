import os

import pytest
import torch

from flyexplore.world import env as E


def test_cpu_environment_report():
    e = E.collect(refresh=True)
    assert e.platform == "cpu"
    assert e.versions["torch"] == torch.__version__
    assert e.versions["aotriton"] == "not present"  # a CUDA/CPU wheel bundles no AOTriton
    assert not e.flydsl_eager.ready and not e.flydsl_compile.ready
    names = {c.name: c for c in e.flydsl_eager.checks}
    assert not names["ROCm build of torch"].ok
    assert "not ROCm" in names["ROCm build of torch"].detail
    assert names["ROCm build of torch"].fix
    fp = e.fingerprint()
    assert fp["platform"] == "cpu" and len(fp["env_id"]) == 12
    text = e.to_text()
    assert "FlyDSL eager overrides: not available" in text and "fix:" in text


def test_torch_215_has_the_flydsl_code():
    if not torch.__version__.startswith("2.15"):
        pytest.fail("the test environment must use torch 2.15 (requirements.txt)")
    e = E.collect(refresh=True)
    names = {c.name: c.ok for c in e.flydsl_eager.checks + e.flydsl_compile.checks}
    assert names["torch has FlyDSL eager overrides"]
    assert names["torch has FlyDSL Inductor templates"]


@pytest.mark.parametrize("torch_v,fly_v,ok,words", [
    ("2.15.0+rocm7.1", "0.3.4.1", True, "accepts 0.3.x"),
    ("2.15.0", "0.5.0", False, "flydsl 0.5.0 installed but torch 2.15 accepts 0.3.x"),
    ("2.15.1", "0.4.2", False, "accepts 0.3.x"),
    ("2.13.0", "0.3.4", False, "no FlyDSL integration"),
    ("2.15.0", "not installed", False, "not installed"),
    ("2.15.0", "0.3.0rc1", False, "is a pre-release"),            # torch's eager check: stable only
    ("2.15.0", "0.3.0.dev1", False, "is a pre-release"),
    ("2.15.0", "0.3.0c1", False, "is a pre-release"),
    ("2.15.0", "0.3.0pre1", False, "is a pre-release"),
    ("2.15.0", "0.3.4+g5a1b2c3", True, "accepts 0.3.x"),          # a local build is no pre-release
    ("2.15.0", "installed, no version metadata", False, "missing or invalid FlyDSL version metadata"),
])
def test_flydsl_version_rule(torch_v, fly_v, ok, words):
    c = E.flydsl_version_check(torch_v, fly_v)
    assert c.ok is ok and words in c.detail
    if not ok and fly_v != "not installed" and torch_v.startswith("2.15") and "metadata" not in words:
        assert c.fix == "pip install 'flydsl==0.3.*'"


def test_target_arch_precedence():
    dev = (E.Device(0, "AMD Instinct MI300X", "gfx942", 304, 0),)
    assert E.resolve_target_arch(dev, "rocm", {}) == ("gfx942", "device gcnArchName")
    assert E.resolve_target_arch(dev, "rocm", {"HSA_OVERRIDE_GFX_VERSION": "9.5.0"}) == ("gfx950", "HSA_OVERRIDE_GFX_VERSION")
    assert E.resolve_target_arch(dev, "rocm", {"FLYDSL_GPU_ARCH": "gfx950", "HSA_OVERRIDE_GFX_VERSION": "9.4.2"}) == ("gfx950", "FLYDSL_GPU_ARCH")
    assert E.resolve_target_arch((), "cpu", {})[0] is None


def test_disable_native_jit_and_arch_are_named():
    e = E.collect(environ={"TORCH_DISABLE_NATIVE_JIT": "1", "FLYDSL_GPU_ARCH": "gfx942"})
    by = {c.name: c for c in e.flydsl_eager.checks}
    assert not by["native overrides not disabled"].ok
    assert "TORCH_DISABLE_NATIVE_JIT=1" in by["native overrides not disabled"].detail
    assert not by["target arch gfx950"].ok and "gfx942" in by["target arch gfx950"].detail
    assert e.env_vars["TORCH_DISABLE_NATIVE_JIT"] == "1"
    ok = E.collect(environ={"FLYDSL_GPU_ARCH": "gfx950"})
    assert {c.name: c.ok for c in ok.flydsl_eager.checks}["target arch gfx950"]


def test_aotriton_version_from_library_name(tmp_path):
    (tmp_path / "lib").mkdir()
    assert E.aotriton_version(str(tmp_path)) == "not present"
    (tmp_path / "lib" / "libaotriton_v2.so.0.14.2").write_text("")
    assert E.aotriton_version(str(tmp_path)) == "0.14.2"


def test_switch_values_read_as_torch_reads_them():
    """torch counts TORCH_DISABLE_NATIVE_JIT / TORCH_NATIVE_SKIP_VERSION_CHECK only when the value is 1."""
    for value, off in (("1", True), ("0", False), ("true", False), ("2", False)):
        e = E.collect(environ={"TORCH_DISABLE_NATIVE_JIT": value})
        assert (not {c.name: c.ok for c in e.flydsl_eager.checks}["native overrides not disabled"]) is off


def test_compile_templates_ignore_flydsl_gpu_arch():
    """Inductor's FlyDSL gate reads the device's gcnArchName, not FLYDSL_GPU_ARCH."""
    e = E.collect(environ={"FLYDSL_GPU_ARCH": "gfx950"})
    assert {c.name: c.ok for c in e.flydsl_eager.checks}["target arch gfx950"]
    dev = {c.name: c for c in e.flydsl_compile.checks}["device arch gfx950"]
    assert not dev.ok and "gcnArchName" in dev.detail


def test_aotriton_version_from_the_soname_of_an_unversioned_library(tmp_path):
    """A torch folder with only lib/libaotriton_v2.so: the version comes from the soname inside
    it (AOTriton sets VERSION X.Y.Z and no SOVERSION); the versioned file name wins when both exist."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libaotriton_v2.so").write_bytes(b"\x7fELF" + bytes(60) + b"libaotriton_v2.so.0.13.0\x00" + bytes(60))
    assert E.aotriton_version(str(tmp_path)) == "0.13.0"
    (lib / "libaotriton_v2.so").write_bytes(b"\x7fELF" + bytes(120))
    assert E.aotriton_version(str(tmp_path)) == "present, version unknown"
    (lib / "libaotriton_v2.so").write_bytes(b"")
    assert E.aotriton_version(str(tmp_path)) == "present, version unknown"
    (lib / "libaotriton_v2.so.0.14.2").write_bytes(b"")
    assert E.aotriton_version(str(tmp_path)) == "0.14.2"


def test_every_attention_row_carries_the_bundled_aotriton_version(tmp_path, monkeypatch):
    """A fake torch folder with libaotriton_v2.so.0.14.2: the environment reports it and every
    attention row of a real CPU sweep -- ok and unavailable ones alike -- carries it."""
    from flyexplore.ops.attention import aotriton as A
    from flyexplore.run import sweep as SW
    from flyexplore.run.spec import SweepSpec

    fake = tmp_path / "torch"
    (fake / "lib").mkdir(parents=True)
    (fake / "lib" / "libaotriton_v2.so.0.14.2").write_bytes(b"")
    real = E.aotriton_version
    monkeypatch.setattr(E, "aotriton_version", lambda torch_dir=None: real(str(fake)))
    env = E.collect(refresh=True)
    assert env.versions["aotriton"] == "0.14.2" and env.fingerprint()["aotriton"] == "0.14.2"
    assert A.release_name(env.versions["aotriton"]) == "0.14.2b"
    monkeypatch.setattr(E, "collect", lambda *a, **k: env)  # the sweep reads the environment through the module
    df = SW.run_sweep(SweepSpec("attention", shapes="1x2x16x16x8;1x2x16x16x8:bwd", backends="math,efficient,default",
                                dtypes="fp32", timer={"rep": 3, "warmup": 1}), progress=False)
    assert len(df) == 6 and {"ok", "unavailable"} <= set(df["status"])
    assert (df["aotriton"] == "0.14.2").all()


def test_skip_version_check_is_read_for_the_eager_path_only():
    """TORCH_NATIVE_SKIP_VERSION_CHECK=1 lets torch's eager check accept any flydsl (missing
    metadata too); Inductor's runtime check ignores it (torch/_inductor/codegen/flydsl/flydsl_utils.py)."""
    from flyexplore.world import readiness as R

    skip = {"TORCH_NATIVE_SKIP_VERSION_CHECK": "1"}
    assert E.flydsl_version_check("2.15.0", "0.5.0", skip).ok
    assert E.flydsl_version_check("2.15.0", R.NO_METADATA, skip).ok
    assert not E.flydsl_version_check("2.15.0", "not installed", skip).ok
    assert not R.compile_flydsl_runtime("0.5.0", True).ok
    assert not R.compile_flydsl_runtime("0.3.4", False).ok      # the _mlir runtime is required there


def test_an_arch_variable_set_but_not_used_is_said_not_called_absent():
    # issue 33 defect 9d: HSA_OVERRIDE_GFX_VERSION=9.5 (not MAJOR.MINOR.STEPPING) was reported as absent
    e = E.collect(environ={"HSA_OVERRIDE_GFX_VERSION": "9.5"}, refresh=True)
    assert e.target_arch is None
    said = "HSA_OVERRIDE_GFX_VERSION='9.5' set but not used: torch reads only gfxNNN or MAJOR.MINOR.STEPPING"
    assert said in e.target_arch_source
    arch = {c.name: c for c in e.flydsl_eager.checks}["target arch gfx950"]
    assert not arch.ok and said in arch.detail and "FLYDSL_GPU_ARCH or HSA_OVERRIDE_GFX_VERSION)" not in arch.detail
    assert said in e.to_text()
    dev = (E.Device(0, "AMD Instinct MI300X", "gfx942", 304, 0),)
    assert E.resolve_target_arch(dev, "rocm", {"FLYDSL_GPU_ARCH": ""}) == (
        "gfx942", "device gcnArchName; FLYDSL_GPU_ARCH='' set but not used")
    assert E.resolve_target_arch(dev, "rocm", {"HSA_OVERRIDE_GFX_VERSION": "9.5.0"}) == ("gfx950", "HSA_OVERRIDE_GFX_VERSION")
    # unset: said as before
    assert "FLYDSL_GPU_ARCH or HSA_OVERRIDE_GFX_VERSION)" in E.R.eager_arch({}, None).detail
