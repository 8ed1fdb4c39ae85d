"""Every catalogue operator parses, and its float64 reference matches an independent numpy
implementation written here (no shared code with factory.spec.reference beyond decoding)."""

import math
import tomllib

import numpy as np
import pytest

from factory import families
from factory.compile import compile_ptx
from factory.spec import (
    catalogue_manifest,
    catalogue_names,
    load_catalogue,
    load_manifest,
    random_inputs,
    reference,
    to_float64,
)
from factory.spec.manifest import with_pooled_dims

EXPECTED = {
    "softmax", "log_softmax", "layernorm", "rmsnorm", "add_rmsnorm", "silu_mul", "gelu_tanh",
    "gelu_erf", "cross_entropy", "row_sum", "row_max", "relu2", "l2norm", "masked_softmax",
    "softmax_long_rows", "axpby", "attention_causal", "attention_softcap", "matmul_bias_gelu",
    "swiglu_up", "bias_grad", "cumsum_rows", "maxpool2d", "instancenorm", "greedy_sampling",
    "mse_loss", "batchnorm_stats",
}  # fmt: skip
# the family each operator lowers to (factory.families.family_for); the rest: the row family
FAMILY = {
    "silu_mul": "flat", "gelu_tanh": "flat", "gelu_erf": "flat", "relu2": "flat", "axpby": "flat",
    "softmax_long_rows": "rowsplit", "attention_causal": "attention",
    "attention_softcap": "attention", "matmul_bias_gelu": "matmul", "swiglu_up": "matmul",
    "bias_grad": "colreduce", "cumsum_rows": "scan", "maxpool2d": "pool",
    "instancenorm": "segnorm", "greedy_sampling": "argreduce", "mse_loss": "allreduce",
    "batchnorm_stats": "segreduce",
}  # fmt: skip
# families whose kernels use sm_90a's instructions (wgmma, TMA)
SM90A = {"attention", "matmul"}
# operators whose suite is not ROW_SUITE: few long rows (the split-row family), and the
# attention, matmul and memory-bound operators with their own shapes
OWN_SUITE = {"cross_entropy", "softmax_long_rows"} | {
    n for n, f in FAMILY.items() if f not in ("row", "flat", "rowsplit")
}
# small shapes for the reference check, where the operator's dims are not M and N
SMALL_OF = {
    "cross_entropy": [{"M": 3, "V": 5}, {"M": 9, "V": 300}],
    "attention_causal": [{"B": 1, "H": 2, "S": 5}, {"B": 2, "H": 1, "S": 17}],
    "attention_softcap": [{"B": 1, "H": 2, "S": 5}, {"B": 2, "H": 1, "S": 17}],
    "matmul_bias_gelu": [{"M": 3, "N": 5, "K": 7}, {"M": 16, "N": 9, "K": 64}],
    "swiglu_up": [{"M": 3, "N": 5, "K": 7}, {"M": 16, "N": 9, "K": 64}],
    "maxpool2d": [{"N": 1, "C": 2, "H": 5, "W": 6}, {"N": 2, "C": 3, "H": 9, "W": 8}],
    "instancenorm": [{"N": 1, "C": 2, "H": 3, "W": 5}, {"N": 2, "C": 3, "H": 8, "W": 7}],
    "greedy_sampling": [{"M": 3, "V": 5}, {"M": 9, "V": 300}],
    "mse_loss": [{"B": 3, "D": 5}, {"B": 7, "D": 64}],
    "batchnorm_stats": [{"N": 1, "C": 2, "H": 3, "W": 5}, {"N": 3, "C": 4, "H": 7, "W": 6}],
}
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
    if name in ("attention_causal", "attention_softcap"):
        q, k, v = a["q"], a["k"], a["v"]
        s = np.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(q.shape[-1])
        if name == "attention_softcap":
            s = 30 * np.tanh(s / 30)
        n = s.shape[-1]
        s = np.where(np.tril(np.ones((n, n), dtype=bool)), s, -np.inf)
        top = s.max(-1, keepdims=True)
        total = np.exp(s - top).sum(-1, keepdims=True)
        out = {"o": np.exp(s - top) / total @ v}
        if name == "attention_causal":
            out["lse"] = (top + np.log(total))[..., 0]
        return out
    if name == "matmul_bias_gelu":
        h = a["x"] @ a["w"].T + a["bias"]
        return {"y": 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))}
    if name == "swiglu_up":
        g = a["x"] @ a["wg"].T
        return {"y": g / (1 + np.exp(-g)) * (a["x"] @ a["wu"].T)}
    if name == "bias_grad":
        return {"db": a["dy"].sum(0)}
    if name == "cumsum_rows":
        return {"y": np.cumsum(a["x"], axis=-1)}
    if name == "maxpool2d":  # 3x3 windows every 2, padding 1 that is never the largest
        x = np.pad(a["x"], ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
        h, w = (a["x"].shape[2] - 1) // 2 + 1, (a["x"].shape[3] - 1) // 2 + 1
        y = np.full(a["x"].shape[:2] + (h, w), -np.inf)
        for i in range(h):
            for j in range(w):
                y[:, :, i, j] = x[:, :, 2 * i : 2 * i + 3, 2 * j : 2 * j + 3].max(axis=(2, 3))
        return {"y": y}
    if name == "instancenorm":
        x = a["x"]
        mu, var = x.mean((2, 3), keepdims=True), x.var((2, 3), keepdims=True)
        return {"y": (x - mu) / np.sqrt(var + 1e-5)}
    if name == "greedy_sampling":
        return {"token": np.argmax(a["logits"], axis=-1)}
    if name == "mse_loss":
        return {"loss": np.mean((a["x"] - a["t"]) ** 2)}
    if name == "batchnorm_stats":
        x = a["x"]
        return {"mu": x.mean((0, 2, 3)), "msq": (x * x).mean((0, 2, 3))}
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
    dims_list = SMALL_OF.get(name, SMALL)
    for seed, dims in enumerate(dims_list):
        dims = with_pooled_dims(w.outputs, dims)  # a pooled axis's size is a derived dim
        storage = random_inputs(w, dims, seed=seed)
        got = reference(w, storage, dims)
        want = independent(name, decoded(w, storage))
        assert set(got) == set(want)
        for k in want:
            assert got[k].shape == np.shape(want[k])
            if np.issubdtype(np.asarray(want[k]).dtype, np.integer):  # an index: exact
                assert got[k].dtype == np.int64
                np.testing.assert_array_equal(got[k], want[k])
                continue
            assert got[k].dtype == np.float64
            np.testing.assert_allclose(got[k], want[k], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(EXPECTED - OWN_SUITE))
def test_row_and_elementwise_operators_use_the_suite_shapes(name):
    assert list(load_catalogue()[name].shapes) == ROW_SUITE


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_operator_lowers_to_its_family(name):
    assert families.name_for(load_catalogue()[name], default="none") == FAMILY.get(name, "row")


@pytest.mark.parametrize("name", sorted(n for n, f in FAMILY.items() if f not in ("row", "flat")))
def test_each_operator_outside_the_row_and_flat_families_emits_ptx_that_compiles(name):
    # the row and flat families' operators are compiled by test_emit and test_fam_flat
    w = load_catalogue()[name]
    fam, ir = families.family_for(w)
    arch = "sm_90a" if fam.name in SM90A else "sm_90"
    emitted = fam.emit(ir, fam.default_schedule(ir, dict(w.shapes[0])), arch)
    ptx = emitted if isinstance(emitted, str) else emitted.ptx
    assert f".target {arch}" in ptx
    report = compile_ptx(ptx, arch)
    assert report.ok, report


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


@pytest.mark.parametrize("name", sorted(FAMILY.keys() - {"softmax_long_rows", "axpby"}))
def test_the_upload_form_offers_each_operator_and_its_manifest_takes_the_customers_dtype(name):
    from portal import catalogue as offered

    assert name in offered.names()
    w = load_catalogue()[name]
    assert len(w.description) > 30, "the description says what the operator computes"
    typed = tomllib.loads(catalogue_manifest(name))["shapes"][-1]  # as a customer types it
    text = offered.manifest_for(name, [typed], "fp16")
    got = load_manifest(text)
    assert list(got.shapes) == [dict(w.shapes[-1])]  # with any derived (pooled) dims
    assert {d.dtype for d in got.inputs} <= {"fp16", "int64"}
    # an fp32 output beside bf16 inputs (a log-sum-exp, a bias gradient) stays fp32
    for o, own in zip(got.outputs, w.outputs, strict=True):
        if own.dtype.startswith("int"):  # an index (argmax's token) stays an integer
            assert o.dtype == own.dtype
            continue
        assert o.dtype == ("fp32" if own.dtype == "fp32" and name != "cumsum_rows" else "fp16")
    assert families.name_for(got, default="none") == FAMILY[name]
