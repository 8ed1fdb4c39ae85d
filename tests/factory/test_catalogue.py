"""Every catalogue operator parses, and its float64 reference matches an independent numpy
implementation written here (no shared code with factory.spec.reference beyond decoding)."""

import math

import numpy as np
import pytest

from factory.spec import (
    catalogue_manifest,
    catalogue_names,
    load_catalogue,
    load_manifest,
    random_inputs,
    reference,
    to_float64,
)

EXPECTED = {
    "softmax", "log_softmax", "layernorm", "rmsnorm", "add_rmsnorm", "silu_mul", "gelu_tanh",
    "gelu_erf", "cross_entropy", "row_sum", "row_max", "relu2", "l2norm", "masked_softmax",
    "softmax_long_rows", "axpby",
}  # fmt: skip
# operators whose suite is not ROW_SUITE: few long rows (the split-row family)
OWN_SUITE = {"cross_entropy", "softmax_long_rows"}
ROW_SUITE = [{"M": 16384, "N": 4096}, {"M": 16384, "N": 8192}, {"M": 32768, "N": 4096}]
SMALL = [{"M": 3, "N": 5}, {"M": 7, "N": 64}, {"M": 1, "N": 257}]


def bf16_bits_to_f64(u):
    return (u.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def round_bf16(v):
    """Independent bf16 rounding: nearest-even via math on float64 (not bit tricks)."""
    out = np.empty_like(v)
    for i, x in np.ndenumerate(v):
        if x == 0 or not math.isfinite(x):
            out[i] = x
            continue
        m, e = math.frexp(x)  # x = m * 2**e, 0.5 <= |m| < 1; bf16 keeps 8 significant bits
        scaled = m * 256
        r = round(scaled)  # Python rounds half to even
        out[i] = math.ldexp(r / 256, e)
    return out


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def independent(name, a):
    """The operator written directly in numpy from its textbook definition."""
    if name in ("softmax", "softmax_long_rows"):
        return {"y": softmax(a["x"])}
    if name == "axpby":
        return {"y": a["alpha"] * a["x"] + a["beta"] * a["z"]}
    if name == "log_softmax":
        return {"y": np.log(softmax(a["x"]))}
    if name == "layernorm":
        x = a["x"]
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return {"y": (x - mu) / np.sqrt(var + 1e-5) * a["weight"] + a["bias"]}
    if name == "rmsnorm":
        x = a["x"]
        return {"y": x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * a["w"]}
    if name == "add_rmsnorm":
        h = round_bf16(a["x"] + a["r"])
        return {"h": h, "y": h / np.sqrt((h**2).mean(-1, keepdims=True) + 1e-6) * a["w"]}
    if name == "silu_mul":
        return {"y": a["a"] / (1 + np.exp(-a["a"])) * a["b"]}
    if name == "gelu_tanh":
        x = a["x"]
        return {"y": 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))}
    if name == "gelu_erf":
        x = a["x"]
        return {"y": 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))}
    if name == "cross_entropy":
        lg, t = a["logits"], a["target"]
        lse = np.log(np.exp(lg).sum(-1))
        return {"loss": lse - lg[np.arange(lg.shape[0]), t]}
    if name == "row_sum":
        return {"y": a["x"].sum(-1)}
    if name == "row_max":
        return {"y": a["x"].max(-1)}
    if name == "relu2":
        return {"y": np.where(a["x"] > 0, a["x"], 0) ** 2}
    if name == "l2norm":
        x = a["x"]
        return {"y": x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)}
    if name == "masked_softmax":
        s = np.where(a["keep"] != 0, a["x"] * 0.125, -np.inf)
        return {"y": softmax(s)}
    raise AssertionError(name)


def decoded(w, storage):
    out = {}
    for d in w.inputs:
        v = storage[d.name]
        out[d.name] = v if d.dtype.startswith("int") else to_float64(v, d.dtype)
    return out


def test_the_catalogue_has_exactly_the_agreed_operators():
    assert set(catalogue_names()) == EXPECTED
    assert set(load_catalogue()) == EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_catalogue_manifest_parses_and_round_trips_its_text(name):
    text = catalogue_manifest(name)
    w = load_manifest(text)
    assert w.name == name
    assert w.manifest == text
    assert w.target == "sm_90"
    assert any(t.startswith("family:") for t in w.tags)
    assert w.heldout_shapes, "held-out shapes are derived"
    for row in w.heldout_shapes:
        assert all(v >= 1 for v in row.values())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_catalogue_reference_matches_an_independent_numpy_version(name):
    w = load_catalogue()[name]
    dims_list = SMALL if name != "cross_entropy" else [{"M": 3, "V": 5}, {"M": 9, "V": 300}]
    for seed, dims in enumerate(dims_list):
        storage = random_inputs(w, dims, seed=seed)
        got = reference(w, storage, dims)
        want = independent(name, decoded(w, storage))
        assert set(got) == set(want)
        for k in want:
            assert got[k].dtype == np.float64
            assert got[k].shape == np.shape(want[k])
            np.testing.assert_allclose(got[k], want[k], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(EXPECTED - OWN_SUITE))
def test_row_and_elementwise_operators_use_the_suite_shapes(name):
    assert list(load_catalogue()[name].shapes) == ROW_SUITE


def test_softmax_long_rows_uses_few_rows_of_a_million():
    w = load_catalogue()["softmax_long_rows"]
    assert [d["M"] for d in w.shapes] == [1, 8, 64]
    assert all(d["N"] == 1 << 20 for d in w.shapes)


def test_cross_entropy_uses_the_vocabulary_suite_and_int64_targets():
    w = load_catalogue()["cross_entropy"]
    assert list(w.shapes) == [{"M": 4096, "V": 32000}, {"M": 4096, "V": 128256}]
    target = next(d for d in w.inputs if d.name == "target")
    assert (target.dtype, target.low, target.high) == ("int64", 0, "V")
    assert w.outputs[0].dtype == "fp32" and w.outputs[0].shape == ("M",)
    assert {"M": 1, "V": 31999} in w.heldout_shapes


def test_default_tolerances_can_never_pass_an_all_zeros_output():
    for w in load_catalogue().values():
        for tol in w.tolerance.values():
            assert 0 < tol.rel_norm < 1
