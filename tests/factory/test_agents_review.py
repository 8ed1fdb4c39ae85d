import pytest

from factory.agents import review
from factory.agents.review import occupancy_warps, scalar_vector_opportunities
from factory.agents.types import CandidateDraft
from factory.compile import compile_ptx
from factory.spec.types import Launch
from tests.factory.test_agents_ptx import CUSTOMER_PTX, LAUNCH, PARAMS

CLEAN = """.version 8.0
.target sm_90
.address_size 64
.visible .entry k(.param .u64 k_x, .param .u64 k_y)
{
  .reg .b64 %rd<4>;
  .reg .f32 %f<5>;
  ld.param.u64 %rd1, [k_x];
  ld.param.u64 %rd2, [k_y];
  ld.global.v4.f32 {%f1, %f2, %f3, %f4}, [%rd1];
  st.global.v4.f32 [%rd2], {%f1, %f2, %f3, %f4};
  ret;
}
"""


def draft(ptx=CLEAN, block=256, schedule=None):
    return CandidateDraft(
        ptx=ptx,
        entry="k",
        params=PARAMS,
        launch=Launch(("M", 1, 1), (block, 1, 1)),
        schedule=schedule,
        parent_ptx_sha256=None,
        role="writer",
        backend="offline",
        note="t",
    )


def report(**kw):
    base = {
        "ok": True,
        "log": "",
        "registers": 32,
        "spill_store_bytes": 0,
        "spill_load_bytes": 0,
        "stack_bytes": 0,
        "smem_bytes": 0,
    }
    return {**base, **kw}


def test_a_clean_vectorised_kernel_passes_with_the_real_compile_report():
    rep = compile_ptx(CLEAN)
    assert rep.ok, rep.log
    assert review(draft(), rep) == (True, "")


def test_a_compile_error_is_rejected_with_the_compilers_words():
    rep = compile_ptx(CLEAN.replace("ret;", "bogus.op %rd1;"))
    ok, reason = review(draft(), rep)
    assert not ok and reason.startswith("compile error:") and "bogus" in reason


@pytest.mark.parametrize(
    ("rep", "block", "start"),
    [
        (report(spill_store_bytes=8), 256, "spills"),
        (report(stack_bytes=16), 256, "local memory"),
        (report(registers=255), 1024, "occupancy"),
        (report(registers=168), 256, "register pressure"),
        (report(), 2048, "forbidden: a block of 2048"),
    ],
)
def test_resource_problems_are_rejected_before_gpu_time(rep, block, start):
    ok, reason = review(draft(block=block), rep)
    assert not ok and reason.startswith(start), reason


@pytest.mark.parametrize(
    ("snippet", "what"),
    [
        (".global .attribute(.managed) .align 4 .b32 g;\n", "managed"),
        (".extern .func (.param .b32 r) vprintf (.param .b64 f, .param .b64 a);\n", "printf"),
        (".extern .func (.param .b64 r) malloc (.param .b64 n);\n", "external"),
    ],
)
def test_forbidden_patterns_are_rejected(snippet, what):
    ptx = CLEAN.replace(".visible", snippet + ".visible")
    ok, reason = review(draft(ptx), report())
    assert not ok and reason.startswith("forbidden") and what in reason


def test_local_state_in_the_ptx_is_rejected_even_when_ptxas_removed_it():
    ptx = CLEAN.replace("  ret;", "  .local .align 4 .b8 buf[16];\n  ret;")
    ok, reason = review(draft(ptx), report())
    assert not ok and reason.startswith("local memory")


def test_adjacent_scalar_loads_are_rejected_for_generated_code_and_a_warning_for_edits():
    assert scalar_vector_opportunities(CUSTOMER_PTX)
    scalar = CLEAN.replace(
        "ld.global.v4.f32 {%f1, %f2, %f3, %f4}, [%rd1];",
        "ld.global.f32 %f1, [%rd1];\n  ld.global.f32 %f2, [%rd1+4];",
    )
    ok, reason = review(draft(scalar), report())
    assert not ok and reason.startswith("scalar global accesses")
    edit = draft(CUSTOMER_PTX, block=128, schedule={"ptx_edit": True})
    edit = CandidateDraft(**{**edit.__dict__, "launch": LAUNCH})
    ok, reason = review(edit, report())
    assert ok and reason.startswith("warning: scalar")


def test_occupancy_follows_the_sm90_register_file():
    assert occupancy_warps(32, 256, 0) == 64
    assert occupancy_warps(64, 256, 0) == 32
    assert occupancy_warps(255, 1024, 0) == 0
    assert occupancy_warps(32, 256, 100 * 1024) == 16


def _generated(workload: str, dims: dict, **change):
    """The generator's default layout for `workload` at `dims` (with `change`), as a draft."""
    import dataclasses

    from factory.agents.context import schedule_dict
    from factory.emit import emit
    from factory.families.row.ir import lower
    from factory.families.row.schedules import default_schedule
    from factory.spec import load_catalogue

    w = load_catalogue()[workload]
    ir = lower(dataclasses.replace(w, shapes=(dims,)))
    schedule = dataclasses.replace(default_schedule(ir, dims), **change)
    em = emit(ir, schedule)
    return CandidateDraft(
        ptx=em.ptx,
        entry=em.entry,
        params=tuple(em.params),
        launch=em.launch,
        schedule=schedule_dict(schedule),
        parent_ptx_sha256=None,
        role="writer",
        backend="offline",
        note="the default layout",
    )


def test_the_shifted_tail_of_a_norm_with_a_weight_is_not_refused_for_its_scalar_columns():
    """At a row length that is not a multiple of 8 the shifted tail moves a norm's rows as
    vectors, its weight and bias element by element (their alignment changes from
    row to row). The reviewer warns of those scalar loads and lets the kernel through; the same
    PTX under another tail would be refused (the check still bites on generated code)."""
    d = _generated("layernorm", {"M": 16384, "N": 4999}, tail="shifted")
    assert scalar_vector_opportunities(d.ptx)  # the weight's element loads, as emitted
    rep = compile_ptx(d.ptx)
    ok, reason = review(d, rep)
    assert ok and reason.startswith("warning: scalar") and "shifted tail" in reason
    other = CandidateDraft(**{**d.__dict__, "schedule": {**d.schedule, "tail": "strided"}})
    ok, reason = review(other, rep)
    assert not ok and reason.startswith("scalar global accesses")
