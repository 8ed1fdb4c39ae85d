"""PTXF_WHOLE_PROGRAM (factory.families.attention.wholeprog.whole_program_enabled): how it is
read, and the attention space it gives: today's space with the setting off (unset or "0"), a
strict superset with it on that holds ping-pong schedules which fit only where setmaxnreg is
honoured (ptxas compiling the PTX as a whole program)."""

import pytest
from test_attention_helpers import workload

from factory import families
from factory.families.attention import schedule as S
from factory.families.attention import wholeprog as WP

VAR = "PTXF_WHOLE_PROGRAM"


@pytest.mark.parametrize(
    "value, on",
    [
        (None, False),
        ("", False),
        ("0", False),
        (" 0 ", False),
        ("false", False),
        ("off", False),
        ("1", True),
        (" 1\n", True),
        ("true", True),
        ("ON", True),
        ("yes", True),
    ],
)
def test_the_setting_reads_1_and_0(value, on):
    env = {} if value is None else {VAR: value}
    assert WP.whole_program_enabled(env) is on


@pytest.mark.parametrize("value", ["2", "maybe", "-1", "1.0"])
def test_anything_else_is_refused_with_the_variable_named(value):
    with pytest.raises(ValueError, match=VAR):
        WP.whole_program_enabled({VAR: value})


def test_the_setting_is_read_at_each_call_not_at_import(monkeypatch):
    monkeypatch.delenv(VAR, raising=False)
    assert WP.whole_program_enabled() is False
    assert S.whole_program() is False
    monkeypatch.setenv(VAR, "1")
    assert WP.whole_program_enabled() is True
    assert S.whole_program() is True
    monkeypatch.setenv(VAR, "0")
    assert S.whole_program() is False


def test_schedule_override_wins_over_the_setting(monkeypatch):
    # WHOLE_PROGRAM None (the default) defers to the setting; True or False overrides it
    assert S.WHOLE_PROGRAM is None
    monkeypatch.setenv(VAR, "1")
    monkeypatch.setattr(S, "WHOLE_PROGRAM", False)
    assert S.whole_program() is False
    monkeypatch.delenv(VAR)
    monkeypatch.setattr(S, "WHOLE_PROGRAM", True)
    assert S.whole_program() is True


def _todays_space(ir, dims_list):
    """The space as it was before the setting: valid everywhere and fitting relocatable."""
    return [s for s in S.candidates(ir) if S.fits(ir, s, dims_list) and S.fits_relocatable(ir, s)]


@pytest.mark.parametrize(
    "variant, causal, d",
    [("softcap", True, 128), ("softcap", False, 128), ("plain", False, 128), ("plain", True, 64)],
)
def test_setting_off_is_todays_space(variant, causal, d, monkeypatch):
    w = workload(variant, causal, d)
    fam, ir = families.family_for(w)
    dims = list(w.shapes)
    today = _todays_space(ir, dims)
    monkeypatch.delenv(VAR, raising=False)
    assert fam.space(ir, dims) == today
    monkeypatch.setenv(VAR, "0")
    assert fam.space(ir, dims) == today
    assert all(S.fits_relocatable(ir, s) for s in today)


@pytest.mark.parametrize("variant, causal", [("softcap", True), ("plain", False)])
def test_setting_on_admits_the_ping_pong_schedules_that_need_setmaxnreg(
    variant, causal, monkeypatch
):
    w = workload(variant, causal, 128)
    fam, ir = families.family_for(w)
    dims = list(w.shapes)
    monkeypatch.delenv(VAR, raising=False)
    off = fam.space(ir, dims)
    monkeypatch.setenv(VAR, "1")
    on = fam.space(ir, dims)
    assert set(off) < set(on)  # a strict superset
    assert [s for s in on if s in off] == off  # today's order kept among today's schedules
    extra = [s for s in on if s not in off]
    # exactly what is_valid allows beyond the relocatable fit
    assert extra == [s for s in S.candidates(ir) if S.fits(ir, s, dims) and s not in off]
    assert all(not S.fits_relocatable(ir, s) for s in extra)
    pp = [s for s in extra if s.pingpong]
    assert pp, [s.label() for s in extra]
    assert all(s.overlap and s.consumers == 2 for s in pp)
    # the PTX of such a schedule issues setmaxnreg: what the worker compiles with ptxas
    assert WP.uses_setmaxnreg(fam.emit(ir, pp[0], "sm_90a").ptx)
    # the seeds and the default still come out of the wider space
    assert fam.default_schedule(ir, dims) in on
    assert all(s in on for s in S.seeds(ir, dims[0]))


def test_uses_setmaxnreg_sees_the_instruction_not_a_comment():
    assert WP.uses_setmaxnreg("  setmaxnreg.dec.sync.aligned.u32 40;\n")
    assert WP.uses_setmaxnreg("L_1: @%p1 setmaxnreg.inc.sync.aligned.u32 232;")
    assert not WP.uses_setmaxnreg("// setmaxnreg.inc.sync.aligned.u32 232;\n  ret;")
    assert not WP.uses_setmaxnreg("/* setmaxnreg.dec.sync.aligned.u32 40; */ ret;")
    assert not WP.uses_setmaxnreg("  mov.u32 %r1, 0;\n")


@pytest.fixture
def fake_reports(monkeypatch):
    """hopper's nvJitLink reports and compile_whole replaced by recorders; ptxas 'found'."""
    import factory.emit.hopper as H
    from factory.compile import CompileReport

    calls = {"jit": [], "whole": []}

    def jit(ptxs):
        calls["jit"].append(list(ptxs))
        return [CompileReport(ok=True, arch="sm_90a", log=f"jit:{p}") for p in ptxs]

    def whole(ptx, arch="sm_90a", ptxas=None):
        calls["whole"].append((ptx, arch, ptxas))
        return CompileReport(ok=True, arch=arch, log=f"whole:{ptx}")

    monkeypatch.setattr(H, "compile_reports", jit)
    monkeypatch.setattr(WP, "compile_whole", whole)
    monkeypatch.setattr(WP, "find_ptxas", lambda: "/opt/fake/ptxas")
    WP._whole.cache_clear()
    yield calls
    WP._whole.cache_clear()


MAXNREG = "  setmaxnreg.dec.sync.aligned.u32 40;\n"


def test_review_reports_follow_the_workers_compiler_choice(fake_reports, monkeypatch):
    ptxs = ["a" + MAXNREG, "plain b", "c" + MAXNREG, "plain b"]
    monkeypatch.delenv(VAR, raising=False)
    off = WP.compile_reports(ptxs)
    assert [r.log for r in off] == [f"jit:{p}" for p in ptxs]
    assert fake_reports["whole"] == []
    monkeypatch.setenv(VAR, "1")
    on = WP.compile_reports(ptxs)
    assert [r.log for r in on] == [
        "whole:a" + MAXNREG,
        "jit:plain b",
        "whole:c" + MAXNREG,
        "jit:plain b",
    ]
    assert sorted(c[0][0] for c in fake_reports["whole"]) == ["a", "c"]  # each once
    assert {c[1:] for c in fake_reports["whole"]} == {("sm_90a", "/opt/fake/ptxas")}
    monkeypatch.setattr(WP, "find_ptxas", lambda: None)  # no ptxas here: nvJitLink's reports
    WP._whole.cache_clear()
    assert [r.log for r in WP.compile_reports(ptxs)] == [f"jit:{p}" for p in ptxs]


def test_with_ptxas_the_reviewer_passes_what_the_wider_space_adds(monkeypatch):
    # nvJitLink's report of a schedule that needs setmaxnreg spills, and the reviewer turns it
    # away; ptxas's (what the worker compiles with the setting on) does not
    from factory.agents.review import review
    from factory.agents.types import CandidateDraft

    if WP.find_ptxas() is None:
        pytest.skip("no CUDA toolkit ptxas here")
    pytest.importorskip("cuda.bindings.nvjitlink")
    w = workload("softcap", True, 128)
    fam, ir = families.family_for(w)
    monkeypatch.setenv(VAR, "1")
    s = next(s for s in fam.space(ir, list(w.shapes)) if not S.fits_relocatable(ir, s))
    em = fam.emit(ir, s, "sm_90a")
    draft = CandidateDraft(
        ptx=em.ptx,
        entry=em.entry,
        params=tuple(em.params),
        launch=em.launch,
        schedule=s.to_dict(),
        parent_ptx_sha256=None,
        role="writer",
        backend="offline",
        note="",
    )
    (on,) = WP.compile_reports([em.ptx])
    assert on.nvjitlink_version.startswith("ptxas") and on.spill_store_bytes == 0
    assert review(draft, on)[0], review(draft, on)[1]
    monkeypatch.setenv(VAR, "0")
    (off,) = WP.compile_reports([em.ptx])
    assert off.spill_store_bytes > 0
    ok, why = review(draft, off)
    assert not ok and "spills" in why
