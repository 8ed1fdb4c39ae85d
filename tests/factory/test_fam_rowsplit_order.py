"""The split-row family's ticket order: pass k of row group g runs in step g + k x lag
beside pass 0 of later groups, the step's rows chunk-major. Run in factory.ptxsim (blocks one
at a time, in block order, so a task whose ticket came before its inputs' would spin for
ever: the timeout catches that) at row counts below, at and above the group and the lag, with
two and three passes, and compared with the float64 reference twice on one memory."""

from __future__ import annotations

import pytest
from test_fam_rowsplit import check, few_rows
from test_fam_workspace_paths import workspace_ops  # noqa: F401 - the fixture

from factory.compile import compile_ptx
from factory.families import rowsplit as RS
from factory.spec import eval_dim_expr, load_manifest

CATALOGUE = "factory/catalogue"

# three passes: the mean, then the mean absolute deviation from it, then the output
MAD_NORM = """
name = "mad_norm"
[inputs.x]
shape = ["M", "N"]
dtype = "fp32"
[let]
d = "x - mean(x, axis=-1, keepdims=True)"
[outputs.y]
expr = "d / (mean(abs(d), axis=-1, keepdims=True) + 1.0)"
dtype = "fp32"
[[shapes]]
M = 4
N = 65536
"""


def schedule(ir, **kw):
    # with the evict-first hints, as the defaults have them (the interpreter checks that each
    # hinted load and store is given the policy createpolicy made)
    base = dict(threads=128, vec=RS.vec_of(ir), unroll=1, chunk=1024, blocks=3, group=1, lag=1,
                stream=True)  # fmt: skip
    return RS.Schedule(**{**base, **kw})


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "name, dims, kw",
    [
        ("softmax", {"M": 5, "N": 2500}, {}),
        ("softmax", {"M": 5, "N": 2500}, {"lag": 2, "blocks": 4}),
        ("softmax", {"M": 1, "N": 3001}, {"lag": 2}),
        ("softmax", {"M": 5, "N": 2500}, {"group": 2}),
        ("layernorm", {"M": 3, "N": 2049}, {"unroll": 2, "chunk": 2048}),
        ("layernorm", {"M": 5, "N": 1999}, {"group": 4, "lag": 2}),
        ("rmsnorm", {"M": 7, "N": 1500}, {"group": 4, "blocks": 5}),
        ("mad_norm", {"M": 4, "N": 2100}, {}),
        ("mad_norm", {"M": 5, "N": 1025}, {"lag": 2, "blocks": 2}),
        ("mad_norm", {"M": 5, "N": 1500}, {"group": 8}),
        ("mad_norm", {"M": 6, "N": 1300}, {"group": 4, "lag": 2, "blocks": 4}),
    ],
    ids=str,
)
def test_lagged_passes_compute_the_reference_twice(workspace_ops, name, dims, kw):  # noqa: F811
    text = MAD_NORM if name == "mad_norm" else few_rows(f"{CATALOGUE}/{name}.toml")
    w = load_manifest(text)
    ir = RS.lower(w)
    assert ir.passes == (3 if name == "mad_norm" else 2)
    s = schedule(ir, **kw)
    assert RS.is_valid(ir, s, dims)[0]
    em = RS.emit(ir, s)
    assert int(eval_dim_expr(em.launch.grid[0], dims)) == s.blocks
    check(w, em, dims)


@pytest.mark.parametrize("group", RS.GROUPS)
@pytest.mark.parametrize("lag", RS.LAGS)
def test_every_group_and_lag_compiles_without_spills(group, lag):
    w = load_manifest(MAD_NORM)
    ir = RS.lower(w)
    s = RS.default_schedule(ir, w.shapes[0])
    s = RS.Schedule(**{**s.to_dict(), "group": group, "lag": lag})
    rep = compile_ptx(RS.emit(ir, s).ptx, "sm_90a")
    assert rep.ok, rep.log
    assert rep.spill_store_bytes == 0


def test_stream_marks_only_the_output_pass_evict_first():
    """RMSNorm: x's last reads (the output pass) and the stores take the evict-first policy;
    the statistics pass's reads of x and the per-column w keep the default, and without
    `stream` nothing is hinted."""
    w = load_manifest(few_rows(f"{CATALOGUE}/rmsnorm.toml"))
    ir = RS.lower(w)
    s = RS.default_schedule(ir, w.shapes[0])
    on = RS.emit(ir, RS.Schedule(**{**s.to_dict(), "stream": True})).ptx
    off = RS.emit(ir, RS.Schedule(**{**s.to_dict(), "stream": False})).ptx
    assert "cache_hint" not in off and "createpolicy" not in off
    assert on.count("createpolicy.fractional.L2::evict_first") == 1
    hinted = [x.strip() for x in on.splitlines() if "L2::cache_hint" in x]
    loads = [x for x in hinted if x.startswith("ld.global.nc.")]
    stores = [x for x in hinted if x.startswith("st.global.")]
    assert len(loads) + len(stores) == len(hinted) and loads and stores
    plain = [x.strip() for x in on.splitlines() if x.strip().startswith("ld.global.nc.v")]
    # unhinted vector loads: x in the statistics pass, w in the output pass (as many as
    # the hinted loads of x there)
    assert len(plain) > len(loads)
    assert compile_ptx(on, "sm_90a").ok


@pytest.mark.parametrize("name", ["softmax", "layernorm", "rmsnorm", "add_rmsnorm"])
def test_the_defaults_over_the_issues_shapes_compile_without_spills(name):
    """Issue 50's few long rows (1-64 rows of 64K-16M elements): each shape's default is
    valid there, keeps a row's passes apart in the ticket order, and compiles for sm_90a
    unspilled."""
    w = load_manifest(few_rows(f"{CATALOGUE}/{name}.toml"))
    ir = RS.lower(w)
    seen = set()
    for rows in (1, 8, 64):
        for n in (1 << 16, 1 << 20, 1 << 24):
            dims = {"M": rows, "N": n}
            s = RS.default_schedule(ir, dims)
            assert RS.is_valid(ir, s, dims)[0], (dims, s)
            # passes two steps apart, or one where a step holds several rows
            assert (s.lag, s.group > 1) in ((2, False), (1, True)), (dims, s)
            assert s.group <= rows and s.stream
            if s not in seen:
                seen.add(s)
                rep = compile_ptx(RS.emit(ir, s).ptx, "sm_90a")
                assert rep.ok and rep.spill_store_bytes == 0, (s, rep.log[-300:])


def test_records_from_before_the_lag_name_the_same_schedule():
    old = {"family": "rowsplit", "threads": 256, "vec": 8, "unroll": 4, "chunk": 8192,
           "blocks": 264, "group": 4}  # fmt: skip
    assert RS.FAMILY.canonical(RS.Schedule.from_dict(old).to_dict()) == old
    new = RS.Schedule(chunk=8192, blocks=528, group=1, lag=2, stream=True).to_dict()
    assert RS.FAMILY.canonical(new) == new
