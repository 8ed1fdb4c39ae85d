"""The whole-tensor reduction family (issue 50): lowering and refusals, space and validity,
the cluster path run in factory.ptxsim against the float64 reference (odd sizes, 16-bit data,
several outputs), the ticket path (module-scope workspace, last block combines) compiled by
nvJitLink (the interpreter models no atomics: its results wait for the GPU)."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest
from test_fam_helpers import run_and_check

from factory import families
from factory.families import Unsupported
from factory.families import allreduce as A
from factory.spec import load_manifest

EXAMPLES = sorted(glob.glob(str(Path(__file__).parents[2] / "factory/examples/allreduce_*.toml")))

M = """
name = "loss"
[inputs.x]
shape = ["N", "C"]
dtype = "{dt}"
[inputs.t]
shape = ["N", "C"]
dtype = "{dt}"
[outputs.y]
expr = "{expr}"
dtype = "{odt}"
[outputs.z]
expr = "{expr2}"
dtype = "fp32"
[[shapes]]
N = 64
C = 40
"""


def w(expr, expr2="max(abs(x - t), axis=None)", dt="fp32", odt="fp32"):
    return load_manifest(M.format(expr=expr, expr2=expr2, dt=dt, odt=odt))


def S(threads, vec, combine, blocks, unroll):  # noqa: N802 - a schedule, briefly
    return A.Schedule(threads=threads, vec=vec, combine=combine, blocks=blocks, unroll=unroll)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: Path(p).stem)
def test_examples_lower_to_the_whole_tensor_family_and_compile(path):
    from factory.compile import compile_ptx

    wl = load_manifest(Path(path).read_text())
    fam, ir = families.family_for(wl)
    assert fam.name == "allreduce"
    for s in A.seeds(ir, dict(wl.shapes[0]))[:3]:
        r = compile_ptx(A.emit(ir, s).ptx, "sm_90", cache=False)
        assert r.ok, r.log[:2000]


def test_the_ticket_path_keeps_its_workspace_in_the_module():
    em = A.emit(A.lower(w("sum(x, axis=None)")), S(512, 4, "ticket", 264, 2))
    assert ".global .align 16 .f32 loss_part[528];" in em.ptx  # 264 blocks x 2 outputs
    assert "atom.acq_rel.gpu.global.add.u32" in em.ptx
    assert em.launch.grid[0] == "min(264, ceildiv((N*C), 2048))"


@pytest.mark.parametrize(
    "expr, says",
    [
        ("sum(x, axis=0)", "every axis"),
        ("sum(x - t, axis=-1)", "every axis"),
        ("cumsum(x, axis=0)", "not a reduction"),
    ],
)
def test_refusals(expr, says):
    with pytest.raises(Unsupported, match=says):
        A.lower(w(expr))


def test_space_validity_defaults_and_seeds():
    wl = w("mean(x * t, axis=None)", dt="bf16")
    ir = A.lower(wl)
    rows = [dict(wl.shapes[0]), *wl.heldout_shapes]
    sp = A.space(ir, rows)
    assert sp and all(A.is_valid(ir, s, d)[0] for s in sp for d in rows)
    big = {"N": 8192, "C": 8192}
    assert A.default_schedule(ir, big).combine == "ticket"
    for d in [*rows, big]:
        assert all(A.is_valid(ir, s, d)[0] for s in A.seeds(ir, d))
    assert "portable" in A.is_valid(ir, S(128, 8, "cluster", 16, 1), None)[1]
    assert "past" not in A.label(S(128, 8, "ticket", 132, 1).to_dict())


CASES = [
    ("mean((x - t) ** 2, axis=None)", "fp32", {"N": 7, "C": 13}, S(128, 4, "cluster", 1, 1)),
    ("sum(x * t, axis=(0, 1))", "bf16", {"N": 37, "C": 41}, S(128, 8, "cluster", 4, 2)),
    ("max(abs(x), axis=None)", "fp32", {"N": 16, "C": 64}, S(256, 4, "cluster", 2, 2)),
    ("min(x, axis=(0, 1))", "fp16", {"N": 3, "C": 5}, S(128, 2, "cluster", 8, 1)),
    ("prod(1.0 + 0.001 * x, axis=None)", "fp32", {"N": 9, "C": 11}, S(128, 1, "cluster", 2, 2)),
    # four vectors in flight: the unrolled sweep, then one at a time, then the elements
    ("sum(x * x, axis=None)", "fp32", {"N": 45, "C": 60}, S(128, 4, "cluster", 1, 4)),
]


@pytest.mark.parametrize("expr, dt, dims, s", CASES, ids=str)
def test_whole_tensor_reductions_compute_the_reference(expr, dt, dims, s):
    run_and_check(A.FAMILY, w(expr, dt=dt), s, dims, seed=4)
