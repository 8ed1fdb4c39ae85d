"""The split-row family's `keep` (issue 50: the second read of a few long rows mostly from
DRAM): the statistics passes' reads of the row take an evict-last L2 policy, beside `stream`'s
evict-first on the output pass's reads and stores. Off, every PTX is as it was; on, the
policies sit where expected, the kernels compile for sm_90 unspilled, and factory.ptxsim runs
them (createpolicy an opaque value each hinted load and store must be given) to the float64
reference, twice on one memory."""

from __future__ import annotations

import pytest
from test_fam_rowsplit import ROW_SCALE, check, few_rows, per_column
from test_fam_workspace_paths import workspace_ops  # noqa: F401 - the fixture

from factory.compile import compile_ptx
from factory.families import rowsplit as RS
from factory.spec import load_manifest

CATALOGUE = "factory/catalogue"
KEEP = "createpolicy.fractional.L2::evict_last.b64"
DROP = "createpolicy.fractional.L2::evict_first.b64"
ISSUE_SHAPES = [{"M": m, "N": n} for m in (1, 8, 64) for n in (1 << 16, 1 << 20, 1 << 24)]


def lowered(name: str):
    w = load_manifest(
        ROW_SCALE if name == "scaled_softmax" else few_rows(f"{CATALOGUE}/{name}.toml")
    )
    return w, RS.lower(w)


def kept(s: RS.Schedule, **kw) -> RS.Schedule:
    return RS.Schedule(**{**s.to_dict(), "keep": True, **kw})


def policy_of(ptx: str, head: str) -> str:
    (line,) = [x.strip() for x in ptx.splitlines() if x.strip().startswith(head)]
    return line.split()[1].rstrip(",")


def hinted_by_pass(ptx: str) -> list[list[str]]:
    """The `.L2::cache_hint` instructions of each pass (the body between a pass's skip branch
    and its end label), in pass order."""
    lines = [x.strip() for x in ptx.splitlines()]
    out, inside = [], None
    for x in lines:
        if "bra.uni $L_pass" in x:
            inside = []
        elif x.startswith("$L_pass") and inside is not None:
            out.append(inside)
            inside = None
        elif inside is not None and "L2::cache_hint" in x:
            inside.append(x)
    return out


@pytest.mark.parametrize("name", ["softmax", "layernorm", "rmsnorm", "add_rmsnorm", "row_sum"])
def test_keep_off_leaves_every_default_as_it_was(name):
    """The default (keep off) names no `keep` in its dict, its tag or its PTX, and its PTX is
    the one emitted from the dict with the field absent (a record from before) and from the
    field written out as False. (Checked against the emitter before `keep` too, when it came:
    621 seeds and space points of six operators, byte-identical.)"""
    w, ir = lowered(name)
    for dims in ISSUE_SHAPES:
        for s in RS.seeds(ir, dims):
            if s.keep:
                continue
            d = s.to_dict()
            assert "keep" not in d and not s.tag().endswith("k")
            ptx = RS.emit(ir, s).ptx
            assert ptx == RS.emit(ir, d).ptx == RS.emit(ir, {**d, "keep": False}).ptx
            assert "evict_last" not in ptx and "'keep'" not in ptx
            assert RS.FAMILY.canonical(d) == RS.FAMILY.canonical({**d, "keep": False})


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("name", ["softmax", "layernorm", "rmsnorm", "scaled_softmax"])
def test_keep_marks_the_statistics_reads_of_the_row_evict_last(name, stream):
    """One evict-last policy; in the statistics pass every hinted instruction is a vector
    load of the row with it (no store); in the output pass only `stream`'s evict-first loads
    and stores. A per-column input is never hinted (ROW_SCALE's b, read in the statistics
    pass: as many unhinted vector loads there as hinted ones of x)."""
    w, ir = lowered(name)
    dims = dict(w.shapes[0])
    s = kept(RS.default_schedule(ir, dims), stream=stream)
    assert RS.is_valid(ir, s, dims)[0] and s.to_dict()["keep"] and s.tag().endswith("k")
    ptx = RS.emit(ir, s).ptx
    assert ptx.count(KEEP) == 1 and ptx.count(DROP) == int(stream)
    keep = policy_of(ptx, KEEP)
    stats, last = hinted_by_pass(ptx)
    assert stats and all(x.startswith("ld.global.nc.L2::cache_hint.v") for x in stats)
    assert all(x.endswith(f", {keep};") for x in stats)
    assert not any(x.endswith(f", {keep};") for x in last)
    if stream:
        drop = policy_of(ptx, DROP)
        assert all(x.endswith(f", {drop};") for x in last)
        assert any(x.startswith("st.global.") for x in last)
        assert any(x.startswith("ld.global.nc.") for x in last)
    else:
        assert last == []
    if name == "scaled_softmax":
        body = ptx[ptx.index("bra.uni $L_pass0") : ptx.index("\n$L_pass0_end")]
        vec = [x.strip() for x in body.splitlines() if x.strip().startswith("ld.global.nc.v")]
        assert len(vec) == len(stats)  # b's loads beside x's, unhinted


def test_keep_is_refused_with_one_pass_and_left_out_of_the_search():
    """One pass has no statistics reads: keep is not valid. With reductions it is a valid
    schedule (the lab bench times it) but neither a seed nor in the space: it timed level with
    the default on an H100."""
    w = load_manifest(per_column(1, 1 << 20))
    ir = RS.lower(w)
    dims = dict(w.shapes[0])
    d = RS.default_schedule(ir, dims)
    assert ir.passes == 1 and not RS.is_valid(ir, kept(d), dims)[0]
    for name in ("softmax", "rmsnorm", "layernorm"):
        w, ir = lowered(name)
        for dims in ISSUE_SHAPES:
            assert RS.is_valid(ir, kept(RS.default_schedule(ir, dims)), dims)[0]
            assert not any(s.keep for s in RS.seeds(ir, dims))
        assert not any(s.keep for s in RS.space(ir, [ISSUE_SHAPES[0]]))
    rec = kept(RS.default_schedule(ir, ISSUE_SHAPES[0])).to_dict()
    assert RS.FAMILY.canonical(rec)["keep"] is True
    assert RS.Schedule.from_dict(rec).keep


@pytest.mark.parametrize("name", ["softmax", "layernorm", "rmsnorm", "add_rmsnorm"])
def test_the_kept_defaults_over_the_issues_shapes_compile_without_spills(name):
    _, ir = lowered(name)
    seen = set()
    for dims in ISSUE_SHAPES:
        s = kept(RS.default_schedule(ir, dims))
        assert RS.is_valid(ir, s, dims)[0], (dims, s)
        if s not in seen:
            seen.add(s)
            rep = compile_ptx(RS.emit(ir, s).ptx, "sm_90")
            assert rep.ok, (s, rep.log[-500:])
            assert rep.spill_store_bytes == 0 and not rep.stack_bytes, (s, rep.log[-300:])


def small(ir, **kw) -> RS.Schedule:
    base = dict(threads=128, vec=RS.vec_of(ir), unroll=1, chunk=1024, blocks=3, group=1, lag=2,
                stream=True, keep=True)  # fmt: skip
    return RS.Schedule(**{**base, **kw})


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "name, dims, kw",
    [
        ("softmax", {"M": 4, "N": 4096}, {}),
        ("softmax", {"M": 3, "N": 2501}, {"unroll": 2, "chunk": 2048}),  # held out: odd
        ("softmax", {"M": 4, "N": 3000}, {"stream": False, "lag": 1}),
        ("rmsnorm", {"M": 4, "N": 4096}, {"group": 4, "lag": 1}),
        ("rmsnorm", {"M": 5, "N": 2049}, {}),  # held out: odd
        ("layernorm", {"M": 3, "N": 1999}, {"blocks": 4}),
        ("scaled_softmax", {"M": 3, "N": 2222}, {"vec": 4, "unroll": 2, "group": 4}),
    ],
    ids=str,
)
def test_kept_kernels_compute_the_reference_twice(workspace_ops, name, dims, kw):  # noqa: F811
    """factory.ptxsim runs the hinted PTX as emitted (no hint taken out): each hinted load and
    store is checked to be given a register createpolicy wrote."""
    w, ir = lowered(name)
    s = small(ir, **kw)
    assert RS.is_valid(ir, s, dims)[0]
    em = RS.emit(ir, s)
    assert KEEP in em.ptx and (DROP in em.ptx) == s.stream
    check(w, em, dims)


def test_the_interpreter_refuses_a_hinted_load_without_its_policy(workspace_ops):  # noqa: F811
    """The evict-last createpolicy replaced by a plain 0 in its register: the interpreter
    stops at the first statistics load (so the test above runs the hints, not around them)."""
    w, ir = lowered("rmsnorm")
    em = RS.emit(ir, small(ir))
    keep = policy_of(em.ptx, KEEP)
    line = next(x for x in em.ptx.splitlines() if KEEP in x)
    ptx = em.ptx.replace(line, f"    mov.u64 {keep}, 0;")
    broken = type(em)(ptx, em.entry, em.params, em.launch)
    with pytest.raises(AssertionError, match="bad policy: ld.global.nc.L2::cache_hint"):
        check(w, broken, {"M": 4, "N": 4096})
