"""The split-row family (few long rows): lowering picks it only where every shape has few long
rows; its kernels compile clean and, run in factory.ptxsim with the workspace extensions of
test_fam_workspace_paths (module-scope arrays, atom.add, div/rem), compute the float64
reference at small odd shapes, twice on one memory (the counters, flags and ticket reset by the
last block), with the same bits both times."""

from __future__ import annotations

import numpy as np
import pytest
from test_fam_workspace_paths import run_twice, workspace_ops  # noqa: F401 - the fixture

from factory import families
from factory.compile import compile_ptx
from factory.families import rowsplit as RS
from factory.families.base import Unsupported
from factory.spec import eval_dim_expr, load_manifest, random_inputs, reference, to_float64

CATALOGUE = "factory/catalogue"


def few_rows(path: str, rows: int = 4, n: int = 65536) -> str:
    """A catalogue manifest with its shapes replaced by one shape of few long rows."""
    with open(path) as f:
        text = f.read()
    head = text.split("[[shapes]]")[0]
    return head + f"\n[[shapes]]\nM = {rows}\nN = {n}\n"


def check(w, em, dims):
    ins = random_inputs(w, dims, 5)
    arrays = dict(ins)
    shapes = {}
    for o in w.outputs:
        shape = tuple(int(dims[d]) if isinstance(d, str) else d for d in o.shape)
        shapes[o.name] = shape
        dt = np.float32 if o.dtype == "fp32" else np.uint16
        arrays[o.name] = np.full(shape, np.nan if o.dtype == "fp32" else 0xFFFF, dt)
    first, second = run_twice(em, dims, arrays, outputs=tuple(shapes))
    want = reference(w, ins, dims)
    for o in w.outputs:
        tol = w.tolerance[o.dtype]
        dt = np.float32 if o.dtype == "fp32" else np.uint16
        for out in (first, second):
            got = to_float64(np.frombuffer(out[o.name], dt).reshape(shapes[o.name]), o.dtype)
            assert np.isfinite(got).all()
            err = np.abs(got - want[o.name])
            assert (err <= tol.atol + tol.rtol * np.abs(want[o.name])).all(), err.max()
            rel = np.linalg.norm(got - want[o.name]) / np.linalg.norm(want[o.name])
            assert rel <= tol.rel_norm, rel
        assert first[o.name] == second[o.name]  # the same bits: every fold in a fixed order


@pytest.mark.parametrize(
    "name, passes",
    [("softmax", 2), ("layernorm", 2), ("rmsnorm", 2), ("add_rmsnorm", 2), ("log_softmax", 2),
     ("row_sum", 2)],
)  # fmt: skip
def test_few_long_rows_of_a_row_operator_go_to_the_split_family(name, passes):
    """Softmax's max and sum of exponentials are one pass (an online pair), LayerNorm's mean
    and variance one pass (moments): a statistics pass and the output pass."""
    w = load_manifest(few_rows(f"{CATALOGUE}/{name}.toml"))
    fam, ir = families.family_for(w)
    assert fam.name == "rowsplit"
    assert ir.passes == passes
    s = RS.default_schedule(ir, w.shapes[0])
    rep = compile_ptx(RS.emit(ir, s).ptx, "sm_90")
    assert rep.ok, rep.log
    assert rep.spill_store_bytes == 0


def test_many_rows_stay_with_the_row_family():
    w = load_manifest(few_rows(f"{CATALOGUE}/softmax.toml", rows=4096, n=4096))
    with pytest.raises(Unsupported, match="row family"):
        RS.lower(w)
    assert families.family_for(w)[0].name == "row"


@pytest.mark.parametrize(
    "name, dims, s",
    [
        (
            "softmax",
            {"M": 3, "N": 2500},
            RS.Schedule(threads=128, vec=8, unroll=1, chunk=1024, blocks=5, group=4),
        ),
        (
            "layernorm",
            {"M": 2, "N": 3001},
            RS.Schedule(threads=128, vec=8, unroll=1, chunk=1024, blocks=3, group=1),
        ),
        (
            "rmsnorm",
            {"M": 5, "N": 2049},
            RS.Schedule(threads=128, vec=8, unroll=1, chunk=1024, blocks=4, group=4),
        ),
        (
            "row_sum",
            {"M": 4, "N": 3333},
            RS.Schedule(threads=128, vec=8, unroll=1, chunk=1024, blocks=3, group=4),
        ),
        (
            "add_rmsnorm",
            {"M": 2, "N": 2500},
            RS.Schedule(threads=128, vec=8, unroll=1, chunk=1024, blocks=3, group=1),
        ),
        (
            "l2norm",
            {"M": 3, "N": 1111},
            RS.Schedule(threads=256, vec=8, unroll=1, chunk=2048, blocks=2, group=4),
        ),
        (
            "log_softmax",
            {"M": 1, "N": 5000},
            RS.Schedule(threads=128, vec=4, unroll=2, chunk=2048, blocks=2, group=1),
        ),
    ],  # fmt: skip
    ids=str,
)
def test_split_rows_compute_the_reference_twice(workspace_ops, name, dims, s):  # noqa: F811
    w = load_manifest(few_rows(f"{CATALOGUE}/{name}.toml"))
    ir = RS.lower(w)
    s = RS.Schedule(**{**s.to_dict(), "vec": RS.vec_of(ir)})
    em = RS.emit(ir, s)
    assert int(eval_dim_expr(em.launch.grid[0], dims)) == s.blocks
    check(w, em, dims)


def per_column(rows: int, n: int) -> str:
    return f"""
name = "bias_gelu"
[inputs.x]
shape = ["M", "N"]
dtype = "bf16"
[inputs.b]
shape = ["N"]
dtype = "bf16"
[outputs.y]
expr = "0.5 * (x + b) * (1.0 + tanh(0.7978845608 * ((x + b) + 0.044715 * (x + b) ** 3)))"
dtype = "bf16"
[[shapes]]
M = {rows}
N = {n}
"""


def test_an_elementwise_operator_with_a_per_column_input_splits_its_rows(workspace_ops):  # noqa: F811
    w = load_manifest(per_column(1, 1 << 20))
    fam, ir = families.family_for(w)
    assert fam.name == "rowsplit" and ir.passes == 1
    dims = {"M": 3, "N": 2100}
    s = RS.Schedule(threads=128, vec=8, unroll=1, chunk=1024, blocks=4, group=1)
    em = RS.emit(ir, s)
    assert "atom" not in em.ptx and ".global .align" not in em.ptx  # no workspace: one pass
    assert int(eval_dim_expr(em.launch.grid[0], dims)) == 4  # min(3 rows x 3 chunks, 4)
    check(w, em, dims)
    assert compile_ptx(em.ptx, "sm_90").ok


ROW_SCALE = """
name = "scaled_softmax"
[inputs.x]
shape = ["M", "N"]
dtype = "fp32"
[inputs.t]
shape = ["M", 1]
dtype = "fp32"
range = [0.5, 2.0]
[inputs.b]
shape = ["N"]
dtype = "fp32"
[let]
z = "x * t + b"
m = "max(z, axis=-1, keepdims=True)"
[outputs.y]
expr = "exp(z - m) / sum(exp(z - m), axis=-1, keepdims=True)"
dtype = "fp32"
[outputs.lse]
expr = "log(sum(exp(z - m), axis=-1)) + max(z, axis=-1)"
dtype = "fp32"
[[shapes]]
M = 2
N = 1048576
"""


def test_a_per_row_input_and_a_per_row_output_split_their_rows(workspace_ops):  # noqa: F811
    """A temperature a row, a bias a column, the softmax and its logsumexp a row."""
    w = load_manifest(ROW_SCALE)
    fam, ir = families.family_for(w)
    assert fam.name == "rowsplit" and ir.passes == 2
    s = RS.Schedule(threads=128, vec=4, unroll=2, chunk=1024, blocks=3, group=4)
    check(w, RS.emit(ir, s), {"M": 3, "N": 2222})
