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
