"""The GPU worker's compiler choice (gpuworker.runner._compile) under PTXF_WHOLE_PROGRAM: ptxas
as a whole program only when the setting is on, the PTX issues setmaxnreg and ptxas is found;
nvJitLink otherwise, with the reason in the report where the setting asked for ptxas. On the
CPU; the real ptxas compile runs where this machine has the CUDA toolkit."""

import struct
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "factory"))

import factory.compile as FC  # noqa: E402
from factory.families.attention import wholeprog as WP  # noqa: E402
from gpuworker import runner  # noqa: E402

VAR = "PTXF_WHOLE_PROGRAM"
PTX_MAXNREG = """.version 8.7
.target sm_90a
.address_size 64
.visible .entry k()
{
    setmaxnreg.dec.sync.aligned.u32 40;
    ret;
}
"""
PTX_PLAIN = PTX_MAXNREG.replace("    setmaxnreg.dec.sync.aligned.u32 40;\n", "")


@pytest.fixture
def fake_compilers(monkeypatch):
    """compile_ptx and compile_whole replaced by recorders; find_ptxas by a switch."""
    calls = []
    state = {"ptxas": "/opt/fake/ptxas"}

    real_target_arch = FC.target_arch

    def fake_ptx(ptx, arch="sm_90", options=(), *, cache=True):
        arch = real_target_arch(ptx, arch)  # what the real one compiles for
        calls.append(("nvjitlink", arch, cache))
        return FC.CompileReport(ok=True, arch=arch, cubin=b"JIT", nvjitlink_version="13.0")

    def fake_whole(ptx, arch="sm_90a", ptxas=None):
        calls.append(("ptxas-whole", arch, ptxas))
        return FC.CompileReport(ok=True, arch=arch, cubin=b"WHOLE", nvjitlink_version="ptxas")

    monkeypatch.setattr(FC, "compile_ptx", fake_ptx)
    monkeypatch.setattr(WP, "compile_whole", fake_whole)
    monkeypatch.setattr(WP, "find_ptxas", lambda: state["ptxas"])
    return calls, state


@pytest.mark.parametrize("setting", [None, "0", "1"])
@pytest.mark.parametrize("maxnreg", [False, True])
@pytest.mark.parametrize("found", [False, True])
def test_ptxas_whole_only_with_the_setting_setmaxnreg_and_ptxas(
    setting, maxnreg, found, fake_compilers, monkeypatch
):
    calls, state = fake_compilers
    state["ptxas"] = "/opt/fake/ptxas" if found else None
    if setting is None:
        monkeypatch.delenv(VAR, raising=False)
    else:
        monkeypatch.setenv(VAR, setting)
    ptx = PTX_MAXNREG if maxnreg else PTX_PLAIN
    report, cubin, err = runner._compile(ptx, runner._compile_arch(ptx, "sm_90"))
    assert err == ""
    whole = setting == "1" and maxnreg and found
    if whole:
        assert calls == [("ptxas-whole", "sm_90a", "/opt/fake/ptxas")]
        assert report["compiler"] == "ptxas-whole" and cubin == b"WHOLE"
    else:
        assert calls == [("nvjitlink", "sm_90a", False)]  # afresh, never from the cache
        assert report["compiler"] == "nvjitlink" and cubin == b"JIT"
    asked_for_ptxas = setting == "1" and maxnreg
    assert ("compiler_note" in report) == (asked_for_ptxas and not found)
    assert report["cubin_bytes"] == len(cubin)


def test_without_ptxas_the_fallback_says_so(fake_compilers, monkeypatch):
    calls, state = fake_compilers
    state["ptxas"] = None
    monkeypatch.setenv(VAR, "1")
    report, cubin, err = runner._compile(PTX_MAXNREG, "sm_90a")
    assert err == "" and cubin == b"JIT"
    assert report["compiler"] == "nvjitlink"
    note = report["compiler_note"]
    assert VAR in note and "no ptxas" in note and "ignores setmaxnreg" in note


def test_the_whole_program_compile_takes_the_same_arch_as_nvjitlink(fake_compilers, monkeypatch):
    calls, _ = fake_compilers
    monkeypatch.setenv(VAR, "1")
    # the device is sm_90; the PTX asks for sm_90a: both compilers get sm_90a
    runner._compile(PTX_MAXNREG, "sm_90")
    monkeypatch.setenv(VAR, "0")
    runner._compile(PTX_MAXNREG, "sm_90")
    assert [c[1] for c in calls] == ["sm_90a", "sm_90a"]


def test_a_refusal_by_ptxas_is_the_candidates_compile_error(monkeypatch):
    monkeypatch.setenv(VAR, "1")
    monkeypatch.setattr(
        WP,
        "compile_whole",
        lambda ptx, arch, ptxas=None: FC.CompileReport(ok=False, arch=arch, log="ptxas fatal: x"),
    )
    monkeypatch.setattr(WP, "find_ptxas", lambda: "/opt/fake/ptxas")
    report, cubin, err = runner._compile(PTX_MAXNREG, "sm_90a")
    assert cubin is None and err == "ptxas fatal: x"
    assert report["compiler"] == "ptxas-whole" and report["ok"] is False


def test_compile_whole_reports_a_ptxas_that_cannot_run(tmp_path):
    missing = tmp_path / "ptxas"
    r = WP.compile_whole(PTX_MAXNREG, "sm_90a", str(missing))
    assert r.ok is False and r.cubin is None and "ptxas did not run" in r.log


def _elf_kind(cubin: bytes) -> tuple:
    """(ELF class, e_type, e_machine, e_flags) of a cubin: e_type 2 is a linked executable
    image (1 would be relocatable), e_machine 190 is CUDA."""
    assert cubin[:4] == b"\x7fELF"
    e_type, e_machine = struct.unpack_from("<HH", cubin, 16)
    (e_flags,) = struct.unpack_from("<I", cubin, 48)
    return cubin[4], e_type, e_machine, e_flags


def _needs_whole_program_ptx():
    from test_attention_helpers import workload

    from factory import families
    from factory.families.attention import schedule as S

    w = workload("softcap", True, 128)
    fam, ir = families.family_for(w)
    pool = [
        s
        for s in S.candidates(ir)
        if S.fits(ir, s, list(w.shapes)) and s.pingpong and not S.fits_relocatable(ir, s)
    ]
    assert pool
    return fam.emit(ir, pool[0], "sm_90a").ptx


def test_a_real_ptxas_compile_gives_a_cubin_loaded_like_nvjitlinks(monkeypatch):
    if WP.find_ptxas() is None:
        pytest.skip("no CUDA toolkit ptxas here")
    pytest.importorskip("cuda.bindings.nvjitlink")
    ptx = _needs_whole_program_ptx()
    monkeypatch.setenv(VAR, "1")
    report, cubin, err = runner._compile(ptx, runner._compile_arch(ptx, "sm_90"))
    assert err == "", err
    assert report["compiler"] == "ptxas-whole" and "compiler_note" not in report
    assert report["ok"] and report["arch"] == "sm_90a"
    assert report["spill_store_bytes"] == 0 and report["spill_load_bytes"] == 0
    assert report["stack_bytes"] == 0
    assert report["nvjitlink_version"].startswith("ptxas")
    assert "setmaxnreg" not in report["log"] or "ignored" not in report["log"]
    # nvJitLink's compile of the same PTX (the setting off) spills: why the setting exists
    monkeypatch.setenv(VAR, "0")
    jit_report, jit_cubin, jit_err = runner._compile(ptx, "sm_90a")
    assert jit_err == "" and jit_report["compiler"] == "nvjitlink"
    assert jit_report["spill_store_bytes"] > 0
    # both are linked (non-relocatable) sm_90a images: the child's ObjectCode.from_cubin
    # (cuLibraryLoadData) takes either the same way
    assert _elf_kind(cubin) == _elf_kind(jit_cubin)
    assert _elf_kind(cubin)[1:3] == (2, 190)
