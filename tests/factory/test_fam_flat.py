"""The flat family (elementwise operators with no reduction and no broadcast): lowering picks
it ahead of the row family for any row length; its kernels compile clean and, run in
factory.ptxsim, compute the float64 reference at odd sizes (tails shorter than a vector, fewer
blocks than chunks so the grid-stride loop turns), in fp32 and bf16, with scalar inputs."""

from __future__ import annotations

import numpy as np
import pytest

from factory import families, ptxsim
from factory.compile import compile_ptx
from factory.families import flat as FL
from factory.families.base import Unsupported
from factory.spec import eval_dim_expr, load_manifest, random_inputs, reference, to_float64

M = """
name = "{name}"
[inputs.a]
shape = ["M", "N"]
dtype = "{dt}"
[inputs.b]
shape = ["M", "N"]
dtype = "{dt}"
[inputs.s]
shape = []
dtype = "fp32"
range = [0.5, 2.0]
[outputs.y]
expr = "{expr}"
dtype = "{dt}"
[[shapes]]
M = {m}
N = {n}
"""


def manifest(expr="a * sigmoid(a) * b + s", dt="bf16", m=256, n=393216, name="flat_op"):
    return load_manifest(M.format(name=name, expr=expr, dt=dt, m=m, n=n))


def check(w, em, dims, grid=None):
    ins = random_inputs(w, dims, 11)
    o = w.outputs[0]
    shape = tuple(int(dims[d]) for d in o.shape)
    store = np.float32 if o.dtype == "fp32" else np.uint16
    arrays = dict(ins) | {o.name: np.full(shape, np.nan if o.dtype == "fp32" else 0xFFFF, store)}
    out = ptxsim.run_kernel(em, dims, arrays, grid=grid)
    got = to_float64(np.frombuffer(out[o.name], store).reshape(shape), o.dtype)
    want = reference(w, ins, dims)[o.name]
    tol = w.tolerance[o.dtype]
    assert np.isfinite(got).all()
    assert (np.abs(got - want) <= tol.atol + tol.rtol * np.abs(want)).all()
    assert np.linalg.norm(got - want) / np.linalg.norm(want) <= tol.rel_norm


@pytest.mark.parametrize("name", ["silu_mul", "gelu_tanh", "gelu_erf", "relu2"])
def test_catalogue_elementwise_operators_go_to_the_flat_family(name):
    with open(f"factory/catalogue/{name}.toml") as f:
        w = load_manifest(f.read())
    fam, ir = families.family_for(w)
    assert fam.name == "flat"
    s = FL.default_schedule(ir, w.shapes[0])
    rep = compile_ptx(FL.emit(ir, s).ptx, "sm_90")
    assert rep.ok, rep.log
    assert rep.spill_store_bytes == 0


def test_a_broadcast_input_is_not_flat():
    text = M.format(name="x", expr="a * b", dt="fp32", m=4, n=4096).replace(
        'shape = ["M", "N"]\ndtype = "fp32"\n[inputs.s]',
        'shape = ["N"]\ndtype = "fp32"\n[inputs.s]',
    )
    w = load_manifest(text)
    with pytest.raises(Unsupported, match="broadcast"):
        FL.lower(w)


@pytest.mark.parametrize(
    "dt, dims, s, grid",
    [
        ("fp32", {"M": 3, "N": 1001}, FL.Schedule(threads=128, vec=4, unroll=2, chunk=1024), 2),
        ("bf16", {"M": 1, "N": 5003}, FL.Schedule(threads=128, vec=8, unroll=1, chunk=1024), 3),
        ("bf16", {"M": 7, "N": 3}, FL.Schedule(threads=128, vec=8, unroll=1, chunk=1024), None),
        ("fp32", {"M": 2, "N": 4096}, FL.Schedule(threads=128, vec=4, unroll=2, chunk=1024), None),
    ],  # fmt: skip
    ids=str,
)
def test_flat_kernels_compute_the_reference(dt, dims, s, grid):
    w = manifest(dt=dt)
    ir = FL.lower(w)
    em = FL.emit(ir, s)
    blocks = int(eval_dim_expr(em.launch.grid[0], dims))
    assert blocks == min(-(-dims["M"] * dims["N"] // s.chunk), s.blocks)
    check(w, em, dims, grid)
    assert compile_ptx(em.ptx, "sm_90").ok
