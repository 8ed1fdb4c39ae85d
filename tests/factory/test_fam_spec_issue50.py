"""The language of issue 50: reductions over any axes (prod too), scans, arg-reductions, inf
constants; their float64 references; index outputs; tolerances that grow with the length."""

from __future__ import annotations

import math

import numpy as np
import pytest

from factory.spec import load_manifest, random_inputs, reference
from factory.spec.expr import ArgReduce, Const, Input, Reduce, Scan
from factory.spec.manifest import DEFAULT_TOLERANCE
from factory.spec.parse import ExprError, ExprParser
from factory.spec.types import SpecError

X = Input("x", ("N", "C", "H"), "fp32")


def parse(text):
    return ExprParser({"x": X}).parse(text)


@pytest.mark.parametrize(
    "text, shape",
    [
        ("sum(x, axis=0)", ("C", "H")),
        ("sum(x, axis=(0, 2))", ("C",)),
        ("mean(x, axis=(-3, -1), keepdims=True)", (1, "C", 1)),
        ("max(x, axis=None)", ()),
        ("min(x, axis=(1,))", ("N", "H")),
        ("prod(x, axis=1)", ("N", "H")),
        ("prod(x)", ("N", "C")),
    ],
)
def test_reductions_over_any_axes(text, shape):
    assert parse(text).shape == shape


def test_several_axes_are_nested_reductions_highest_first():
    n = parse("sum(x, axis=(0, 2))")
    assert isinstance(n, Reduce) and n.axis == 0 and n.x.axis == 2 and n.x.x == X


def test_scans_and_arg_reductions_parse():
    s = parse("cumsum(x, axis=1, exclusive=True, reverse=True)")
    assert isinstance(s, Scan) and (s.op, s.axis, s.exclusive, s.reverse) == ("sum", 1, True, True)
    assert s.shape == X.shape
    assert parse("cumprod(x)").op == "prod"
    a = parse("argmin(x, axis=0, keepdims=True)")
    assert isinstance(a, ArgReduce) and a.shape == (1, "C", "H") and a.dtype == "int64"


def test_inf_constants():
    assert parse("inf") == Const(math.inf)
    assert parse("-inf") == Const(-math.inf)
    assert ExprParser({"inf": X}).parse("inf") == X  # a manifest's own name wins


@pytest.mark.parametrize(
    "text, says",
    [
        ("sum(x, axis=(0, 0))", "twice"),
        ("sum(x, axis=(0, 3))", "out of range"),
        ("sum(x, axis=())", "names no axis"),
        ("argmax(x, axis=(0, 1))", "one axis"),
        ("cumsum(x, axis=5)", "out of range"),
        ("cumsum(x, keepdims=True)", "unexpected keyword"),
        ("cumsum(x, exclusive=1)", "True or False"),
        ("prod(x, x)", "one tensor"),
        ("argmax(x > 0)", "comparison"),
        ("sum(x, axis=(0, 'a'))", "small integer"),
    ],
)
def test_refusals(text, says):
    with pytest.raises(ExprError, match=says):
        parse(text)


MANIFEST = """
name = "t"
[inputs.x]
shape = ["N", "C", "H"]
dtype = "fp32"
[outputs.y]
expr = "{expr}"
dtype = "{dtype}"
[[shapes]]
N = 5
C = 3
H = 7
"""


def load(expr, dtype="fp32"):
    return load_manifest(MANIFEST.format(expr=expr, dtype=dtype))


@pytest.mark.parametrize(
    "expr, fn",
    [
        ("sum(x, axis=(0, 2))", lambda x: x.sum(axis=(0, 2))),
        ("mean(x, axis=(0, 2))", lambda x: x.mean(axis=(0, 2))),
        ("max(x, axis=None)", lambda x: x.max()),
        ("prod(x, axis=0, keepdims=True)", lambda x: x.prod(axis=0, keepdims=True)),
        ("cumsum(x, axis=1)", lambda x: np.cumsum(x, axis=1)),
        ("cumprod(x, axis=-1)", lambda x: np.cumprod(x, axis=-1)),
        (
            "cumsum(x, axis=2, exclusive=True)",
            lambda x: np.concatenate([np.zeros_like(x[..., :1]), np.cumsum(x, 2)[..., :-1]], 2),
        ),
        ("cumsum(x, axis=0, reverse=True)", lambda x: np.flip(np.cumsum(np.flip(x, 0), 0), 0)),
        (
            "cumprod(x, axis=0, reverse=True, exclusive=True)",
            lambda x: np.concatenate(
                [np.flip(np.cumprod(np.flip(x, 0), 0), 0)[1:], np.ones_like(x[:1])], 0
            ),
        ),
    ],
)
def test_float64_references(expr, fn):
    w = load(expr)
    dims = {"N": 5, "C": 3, "H": 7}
    ins = random_inputs(w, dims, 3)
    got = reference(w, ins, dims)["y"]
    np.testing.assert_allclose(got, fn(ins["x"].astype(np.float64)), rtol=1e-12, atol=1e-12)


def test_arg_reductions_give_the_first_index_on_ties():
    w = load("argmax(x, axis=1)", "int32")
    assert w.outputs[0].dtype == "int32" and w.tolerance["int32"].atol == 0.0
    dims = {"N": 5, "C": 3, "H": 7}
    x = np.zeros((5, 3, 7), np.float32)
    x[0, 2, 0] = 1.0
    got = reference(w, {"x": x}, dims)["y"]
    want = np.argmax(x, axis=1)
    assert (got == want).all() and got[0, 0] == 2 and got[1, 1] == 0


def test_an_index_dtype_needs_an_arg_reduction():
    with pytest.raises(SpecError, match="must be an argmax"):
        load("sum(x, axis=0)", "int64")


def test_a_mask_with_minus_inf_is_allowed():
    w = load("sum(exp(where(x > 0, x, -inf)), axis=0)")
    assert w.outputs[0].shape == ("C", "H")


def test_tolerances_grow_with_the_reduced_length_only_for_the_new_kinds():
    text = MANIFEST.replace("N = 5", "N = 100000")
    w = load_manifest(text.format(expr="sum(x, axis=0)", dtype="fp32"))
    tol = w.tolerance["fp32"]
    assert tol.atol == pytest.approx(2.0**-24 * 4 * 100000)
    assert tol.rel_norm > DEFAULT_TOLERANCE["fp32"].rel_norm
    # along the last axis (the row family's reductions): unchanged
    w = load_manifest(text.format(expr="sum(x, axis=-1)", dtype="fp32"))
    assert w.tolerance["fp32"] == DEFAULT_TOLERANCE["fp32"]
    # max is exact; a given tolerance is kept
    w = load_manifest(text.format(expr="max(x, axis=0)", dtype="fp32"))
    assert w.tolerance["fp32"] == DEFAULT_TOLERANCE["fp32"]
    given = text.format(expr="sum(x, axis=0)", dtype="fp32") + "[tolerance.fp32]\natol = 0.5\n"
    assert load_manifest(given).tolerance["fp32"].atol == 0.5
    w = load_manifest(text.format(expr="cumprod(x, axis=0)", dtype="fp32"))
    assert w.tolerance["fp32"].rtol == pytest.approx(2.0**-24 * 100000)
