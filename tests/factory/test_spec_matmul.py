"""The manifest language's matrix products: `a @ b`, `matmul(a, b)`, `w.T`; their shapes, the
refusals (naming the field), the derived held-out shapes and the float64 reference."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from factory.spec import SpecError, load_manifest, random_inputs, reference, to_float64
from factory.spec import expr as E


def linear(expr="x @ w.T", w_shape=("N", "K"), extra_inputs="", x_shape=("M", "K"), rows=None):
    rows = rows or {"M": 48, "N": 40, "K": 32}
    shapes = "\n".join(f"{k} = {v}" for k, v in rows.items())
    return f"""
name = "mm"
[inputs.x]
shape = {list(x_shape)!r}
dtype = "bf16"
range = [-1.0, 1.0]
[inputs.w]
shape = {list(w_shape)!r}
dtype = "bf16"
range = [-1.0, 1.0]
{extra_inputs}
[outputs.y]
expr = "{expr}"
dtype = "bf16"
[[shapes]]
{shapes}
""".replace("'", '"')


def refuse(text) -> SpecError:
    with pytest.raises(SpecError) as e:
        load_manifest(text)
    return e.value


def decoded(w, inputs):
    return {t.name: to_float64(inputs[t.name], t.dtype) for t in w.inputs}


# -- parsing and shapes ---------------------------------------------------------------------------


def test_at_and_matmul_are_the_same_node():
    a = load_manifest(linear("x @ w.T")).outputs[0].expr
    b = load_manifest(linear("matmul(x, w.T)")).outputs[0].expr
    assert a == b
    assert isinstance(a, E.MatMul) and a.shape == ("M", "N")
    assert isinstance(a.b, E.Transpose) and a.b.shape == ("K", "N")
    assert a.b.x == E.Input("w", ("N", "K"), "bf16")


def test_a_row_major_right_operand_needs_no_transpose():
    w = load_manifest(linear("x @ w", w_shape=("K", "N")))
    mm = w.outputs[0].expr
    assert isinstance(mm.b, E.Input) and mm.shape == ("M", "N")


def test_batch_axes_broadcast():
    text = linear("x @ w.T", x_shape=("B", "M", "K"), rows={"B": 3, "M": 16, "N": 8, "K": 24})
    w = load_manifest(text)
    assert w.outputs[0].shape == ("B", "M", "N")
    text = linear(
        "x @ w",
        x_shape=("B", "M", "K"),
        w_shape=(1, "K", "N"),
        rows={"B": 2, "M": 8, "N": 8, "K": 16},
    )
    assert load_manifest(text).outputs[0].shape == ("B", "M", "N")


def test_epilogue_broadcasts_bias_row_scale_and_residual():
    extra = """
[inputs.bias]
shape = ["N"]
dtype = "bf16"
[inputs.s]
shape = ["M", 1]
dtype = "fp32"
[inputs.r]
shape = ["M", "N"]
dtype = "bf16"
"""
    w = load_manifest(linear("(x @ w.T + bias) * s + r", extra_inputs=extra))
    assert w.outputs[0].shape == ("M", "N")


def test_transpose_of_a_transpose_is_the_tensor():
    w = load_manifest(linear("x @ w.T.T", w_shape=("K", "N")))
    assert isinstance(w.outputs[0].expr.b, E.Input)


@pytest.mark.parametrize(
    ("expr", "w_shape", "needle"),
    [
        ("x @ w", ("N", "K"), "second-to-last of the right (N)"),
        ("x @ w", ("N", "K"), "write a @ w.T"),
        ("matmul(x)", ("N", "K"), "matmul() takes 2 arguments"),
        ("matmul(x, w.T, w)", ("N", "K"), "matmul() takes 2 arguments"),
        ("x @ sum(w, axis=-1)", ("N", "K"), "at least two axes"),
        ("x @ (x > 0)", ("K", "N"), "is a comparison"),
        ("x.T @ w.T", ("N", "K"), "second-to-last"),
        ("x @ w.X", ("N", "K"), "attribute access"),
        ("sum(x, axis=-1).T", ("N", "K"), "needs a 2-D tensor"),
        ("x @@ w", ("N", "K"), "syntax error"),
    ],
)
def test_refusals_name_the_field(expr, w_shape, needle):
    e = refuse(linear(expr, w_shape=w_shape))
    assert e.errors[0][0] == "outputs.y.expr", e.errors
    assert needle in str(e), str(e)


def test_an_index_operand_is_refused():
    extra = '[inputs.t]\nshape = ["K", "N"]\ndtype = "int32"\nrange = [0, 4]'
    e = refuse(linear("x @ t", extra_inputs=extra))
    assert "index tensor" in str(e) and e.errors[0][0] == "outputs.y.expr"


def test_batch_axes_that_do_not_broadcast_are_refused():
    text = linear(
        "x @ w", x_shape=("B", "M", "K"), w_shape=("C", "K", "N"),
        rows={"B": 2, "C": 3, "M": 8, "N": 8, "K": 16},
    )  # fmt: skip
    assert "do not broadcast" in str(refuse(text))


def test_matmul_is_a_reserved_name():
    text = linear().replace("[inputs.w]", "[inputs.matmul]").replace("w.T", "matmul.T")
    assert "built-in function name" in str(refuse(text))


def test_a_let_can_hold_the_product():
    text = linear("h * sigmoid(h)").replace("[outputs.y]", '[let]\nh = "x @ w.T"\n[outputs.y]')
    w = load_manifest(text)
    assert isinstance(w.outputs[0].expr.a, E.MatMul)


# -- held-out shapes ------------------------------------------------------------------------------


def test_heldout_shapes_keep_k_a_multiple_of_8():
    w = load_manifest(linear(rows={"M": 4096, "N": 4096, "K": 4096}))
    assert [dict(d) for d in w.heldout_shapes] == [
        {"M": 1, "N": 4095, "K": 4088},
        {"M": 37, "N": 4099, "K": 4104},
    ]
    for d in w.heldout_shapes:
        assert d["K"] % 8 == 0 and d["K"] % 64


def test_row_operators_keep_their_heldout_shapes():
    text = linear("x * 2", rows={"M": 48, "K": 32}).replace(
        '[inputs.w]\nshape = ["N", "K"]', '[inputs.w]\nshape = ["K"]'
    )
    w = load_manifest(text)
    assert [dict(d) for d in w.heldout_shapes] == [{"M": 1, "K": 31}, {"M": 37, "K": 35}]


# -- the float64 reference ------------------------------------------------------------------------


def test_reference_of_a_linear_layer_with_bias_and_gelu():
    extra = '[inputs.bias]\nshape = ["N"]\ndtype = "bf16"'
    expr = "0.5 * h * (1 + tanh(0.7978845608028654 * (h + 0.044715 * h ** 3)))"
    text = linear(expr, extra_inputs=extra).replace(
        "[outputs.y]", '[let]\nh = "x @ w.T + bias"\n[outputs.y]'
    )
    w = load_manifest(text)
    for dims in [w.shapes[0], *w.heldout_shapes]:
        inputs = random_inputs(w, dims, seed=3)
        got = reference(w, inputs, dims)["y"]
        f = decoded(w, inputs)
        h = f["x"] @ f["w"].T + f["bias"]
        want = 0.5 * h * (1 + np.tanh(0.7978845608028654 * (h + 0.044715 * h**3)))
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_reference_of_swiglu_two_products():
    text = linear("silu").replace(
        '[outputs.y]\nexpr = "silu"',
        '[inputs.u]\nshape = ["N", "K"]\ndtype = "bf16"\n'
        '[outputs.y]\nexpr = "(x @ w.T) * sigmoid(x @ w.T) * (x @ u.T)"',
    )
    w = load_manifest(text)
    dims = w.shapes[0]
    inputs = random_inputs(w, dims, seed=1)
    f = decoded(w, inputs)
    g, u = f["x"] @ f["w"].T, f["x"] @ f["u"].T
    np.testing.assert_allclose(
        reference(w, inputs, dims)["y"], g / (1 + np.exp(-g)) * u, rtol=1e-12
    )


def test_reference_batched_and_row_major():
    rows = {"B": 3, "M": 5, "N": 7, "K": 16}
    w = load_manifest(linear("x @ w", x_shape=("B", "M", "K"), w_shape=("K", "N"), rows=rows))
    inputs = random_inputs(w, rows, seed=2)
    f = decoded(w, inputs)
    np.testing.assert_allclose(reference(w, inputs, rows)["y"], np.matmul(f["x"], f["w"]))


def test_reference_in_row_blocks_matches_the_whole():
    """Large enough that the reference splits the largest input's rows into blocks: a split along
    the weight's N is exact; along a summed K it must not split."""
    rows = {"M": 64, "N": 8192, "K": 520}
    w = load_manifest(linear("x @ w.T + 1", rows=rows))
    ref_mod = importlib.import_module("factory.spec.reference")

    assert ref_mod._row_plan(w, rows) is not None  # split along N
    inputs = random_inputs(w, rows, seed=5)
    f = decoded(w, inputs)
    np.testing.assert_allclose(reference(w, inputs, rows)["y"], f["x"] @ f["w"].T + 1, rtol=1e-12)
    rows = {"M": 64, "N": 520, "K": 8192}
    w = load_manifest(linear("x @ w", w_shape=("K", "N"), rows=rows))
    assert ref_mod._row_plan(w, rows) is None  # K, the largest input's first axis, is summed
    inputs = random_inputs(w, rows, seed=6)
    f = decoded(w, inputs)
    np.testing.assert_allclose(reference(w, inputs, rows)["y"], f["x"] @ f["w"], rtol=1e-12)


def test_a_transposed_view_is_never_overwritten_in_place():
    """w feeds w.T (a view) and exp(w): evaluating exp(w) in w's buffer would change w.T."""
    text = """
name = "views"
[inputs.x]
shape = ["M", "K"]
dtype = "fp32"
[inputs.w]
shape = ["K", "K"]
dtype = "fp32"
[outputs.z]
expr = "exp(w) + 1"
dtype = "fp32"
[outputs.y]
expr = "x @ w.T"
dtype = "fp32"
[[shapes]]
M = 8
K = 16
"""
    w = load_manifest(text)
    dims = w.shapes[0]
    inputs = random_inputs(w, dims, seed=0)
    f = decoded(w, inputs)
    got = reference(w, inputs, dims)
    np.testing.assert_allclose(got["y"], f["x"] @ f["w"].T, rtol=1e-12)
    np.testing.assert_allclose(got["z"], np.exp(f["w"]) + 1, rtol=1e-12)


# -- limits and tolerances ------------------------------------------------------------------------


def test_matrix_products_too_costly_for_the_reference_are_refused():
    e = refuse(linear(rows={"M": 65536, "N": 65536, "K": 8192}))
    assert any(f == "shapes[0]" and "multiply-adds" in p for f, p in e.errors), e.errors
    load_manifest(linear(rows={"M": 16384, "N": 14336, "K": 4096}))  # the shapes pass


def test_fp32_outputs_of_a_product_get_a_tolerance_grown_with_k():
    text = linear(rows={"M": 64, "N": 64, "K": 8192}).replace(
        'expr = "x @ w.T"\ndtype = "bf16"', 'expr = "x @ w.T"\ndtype = "fp32"'
    )
    t = load_manifest(text).tolerance["fp32"]
    # ranges [-1, 1] on both operands; K up to 8200 among the held-out shapes
    assert t.atol == pytest.approx(2.0**-24 * 8200)
    assert t.rel_norm == pytest.approx(4 * 2.0**-24 * 8200**0.5)
    given = text + "[tolerance.fp32]\natol = 1e-5\n"
    assert load_manifest(given).tolerance["fp32"].atol == 1e-5  # a given tolerance stays
    # bf16 outputs keep their default: the output's rounding dominates
    assert load_manifest(linear(rows={"M": 64, "N": 64, "K": 8192})).tolerance["bf16"].atol == 1e-2


# -- fp8 e4m3 outputs -----------------------------------------------------------------------------


def test_fp8_e4m3_bits_round_trip_and_saturate():
    from factory.spec import to_storage

    codes = np.arange(256, dtype=np.uint8)
    v = to_float64(codes, "fp8e4m3")
    finite = ~np.isnan(v)
    assert finite.sum() == 254  # 0x7F and 0xFF are NaN; no infinities
    assert np.array_equal(to_storage(v[finite], "fp8e4m3"), codes[finite])
    assert np.nanmax(v) == 448.0 and v[1] == 2.0**-9  # the largest, the smallest subnormal
    got = to_float64(to_storage(np.array([1e3, -np.inf, 2.0**-10, 3 * 2.0**-11, 17.0]), "fp8e4m3"),
                     "fp8e4m3")  # fmt: skip
    assert list(got) == [448.0, -448.0, 0.0, 2.0**-9, 16.0]  # saturated; ties to even
    assert np.isnan(to_float64(to_storage(np.array([np.nan]), "fp8e4m3"), "fp8e4m3")[0])


def test_fp8_e4m3_rounding_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = rng.standard_normal(50000) * np.exp(rng.uniform(-12, 6, 50000))
    x = x[np.abs(x) <= 448]
    from factory.spec import to_storage

    theirs = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    assert np.array_equal(to_storage(x, "fp8e4m3"), theirs)


def test_a_quantised_fp8_output_is_declared_and_refused_by_the_family_for_now():
    extra = '[inputs.inv_scale]\nshape = ["M", 1]\ndtype = "fp32"\nrange = [50.0, 100.0]'
    text = linear("(x @ w.T) * inv_scale", extra_inputs=extra).replace(
        'dtype = "bf16"\n[[shapes]]', 'dtype = "fp8e4m3"\n[[shapes]]'
    )
    w = load_manifest(text)
    assert w.outputs[0].dtype == "fp8e4m3" and w.tolerance["fp8e4m3"].rel_norm == 0.05
    from factory import families

    with pytest.raises(families.Unsupported, match="fp8 stores are not emitted yet"):
        families.family_for(w)
    e = refuse(text.replace('[inputs.x]\nshape = ["M", "K"]\ndtype = "bf16"',
                            '[inputs.x]\nshape = ["M", "K"]\ndtype = "fp8e4m3"'))  # fmt: skip
    assert e.errors[0][0] == "inputs.x.dtype"  # fp8 is an output's storage only, for now
