"""The matmul family's torch-side baselines on the CPU: what each computes equals the float64
reference on small shapes; the activation is recognised however the manifest wrote it; the
function reads as a customer's torch code; Triton is reported unavailable where it is absent."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from factory import families
from factory.families.matmul import baselines as B
from factory.spec import expr as E
from factory.spec import load_manifest, random_inputs, reference
from factory.spec.types import BaselineUnavailable

EXAMPLES = Path(__file__).resolve().parents[2] / "factory" / "examples"
NAMES = ["matmul_bias_gelu", "swiglu_up", "linear_residual", "matmul_relu2_scaled"]
SMALL = {"M": 37, "N": 72, "K": 64}


def example(name):
    return load_manifest((EXAMPLES / f"{name}.toml").read_text())


def manifest(expr, inputs, rows=None, let=""):
    text = 'name = "t"\n' + (f"[let]\n{let}\n" if let else "")
    for name, (shape, dtype) in inputs.items():
        text += f'[inputs.{name}]\nshape = {shape!r}\ndtype = "{dtype}"\nrange = [-1.0, 1.0]\n'
    text += f'[outputs.y]\nexpr = "{expr}"\ndtype = "bf16"\n[[shapes]]\n'
    text += "".join(f"{k} = {v}\n" for k, v in (rows or SMALL).items())
    return load_manifest(text.replace("'", '"'))


XW = {"x": (["M", "K"], "bf16"), "w": (["N", "K"], "bf16")}


# -- recognising activations (numpy only) ---------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "name"),
    [
        ("0.5 * h * (1 + tanh(0.7978845608028654 * (h + 0.044715 * h ** 3)))", "gelu_tanh"),
        ("h * 0.5 * (1 + erf(h * 0.7071067811865476))", "gelu"),
        ("h * sigmoid(h)", "silu"),
        ("h / (1 + exp(-h))", "silu"),
        ("max(h, 0)", "relu"),
        ("where(h > 0, h, 0)", "relu"),
        ("max(h, 0) ** 2", "relu2"),
        ("sigmoid(h)", "sigmoid"),
        ("tanh(h)", "tanh"),
        ("h * 2", None),
    ],
)
def test_activations_are_recognised_however_written(expr, name):
    w = manifest(expr, XW, let='h = "x @ w.T"').outputs[0].expr
    h = next(n for n in E.walk(w) if isinstance(n, E.MatMul))
    assert B.identify_activation(w, h) == name


def test_the_plan_finds_linear_bias_and_activation():
    linears, acts = B.plan(example("matmul_bias_gelu"))
    biased = [lin for lin in linears.values() if lin.bias]
    assert len(biased) == 1 and biased[0].bias == "bias" and biased[0].w_layout == "col"
    (act,) = acts.values()
    assert act.name == "gelu_tanh" and act.of == biased[0].node


# -- torch on the CPU -----------------------------------------------------------------------------

torch = pytest.importorskip("torch")


def as_torch(inputs):
    out = {}
    for k, v in inputs.items():
        if v.dtype == np.uint16:
            out[k] = torch.from_numpy(v.view(np.int16).copy()).view(torch.bfloat16)
        else:
            out[k] = torch.from_numpy(v.copy())
    return out


def rel_error(got, ref):
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))


@pytest.mark.parametrize("name", NAMES)
def test_idiomatic_matches_the_reference(name):
    w = example(name)
    fn, how = families.baselines_module("matmul").idiomatic("torch_eager", w, compiled=False)
    assert fn is not None and how
    dims = {**SMALL}
    inputs = random_inputs(w, dims, seed=7)
    ref = reference(w, inputs, dims)
    out = fn(as_torch(inputs))
    for o in w.outputs:
        got = out[o.name]
        assert got.dtype == torch.bfloat16 and tuple(got.shape) == (37, 72)
        err = rel_error(got.float().numpy().astype(np.float64), ref[o.name])
        assert err <= w.tolerance[o.dtype].rel_norm, (name, err)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("matmul_bias_gelu", 'F.gelu(F.linear(x, w, bias), approximate="tanh")'),
        ("swiglu_up", "F.silu(F.linear(x, wg))"),
        ("linear_residual", "torch.addmm(r, x, w.T)"),
        ("matmul_relu2_scaled", "F.relu(F.linear(x, w)).square()"),
    ],
)
def test_the_function_reads_as_a_customer_writes_it(name, text):
    _, how = B.idiomatic("torch_eager", example(name), compiled=True)
    assert text in how, how


def test_row_major_weight_with_bias_uses_addmm():
    inputs = {"x": (["M", "K"], "bf16"), "w": (["K", "N"], "bf16"), "b": (["N"], "bf16")}
    w = manifest("x @ w + b", inputs)
    fn, how = B.idiomatic("torch_eager", w, compiled=False)
    assert "torch.addmm(b, x, w)" in how
    inputs = random_inputs(w, SMALL, seed=1)
    got = fn(as_torch(inputs))["y"].float().numpy()
    assert rel_error(got, reference(w, inputs, SMALL)["y"]) < 1e-2


def test_batched_and_op_by_op_epilogues():
    inputs = {"x": (["B", "M", "K"], "bf16"), "w": (["N", "K"], "bf16"), "r": (["M", 1], "fp32")}
    rows = {"B": 2, **SMALL}
    w = manifest("where(x @ w.T > 0, x @ w.T, 0.1 * (x @ w.T)) * r + 1", inputs, rows)
    fn, _ = B.idiomatic("torch_compile", w, compiled=True)
    data = random_inputs(w, rows, seed=4)
    got = fn(as_torch(data))["y"].float().numpy()
    assert got.shape == (2, 37, 72)
    assert rel_error(got, reference(w, data, rows)["y"]) < 1e-2


def test_no_product_means_no_idiomatic_function():
    w = manifest("x * 2", {"x": (["M", "K"], "bf16")}, {"M": 4, "K": 8})
    assert B.idiomatic("torch_eager", w, compiled=False) == (None, None)


@pytest.mark.skipif(importlib.util.find_spec("triton") is not None, reason="triton is installed")
def test_triton_is_unavailable_without_triton():
    with pytest.raises(BaselineUnavailable, match="triton"):
        B.library("triton", example("matmul_bias_gelu"))
    with pytest.raises(BaselineUnavailable, match="liger"):
        B.library("liger", example("matmul_bias_gelu"))


def test_the_triton_path_composes_with_a_fused_linear():
    """The Triton baseline's plumbing with a stand-in kernel (torch on the CPU): the activation
    goes to the kernel when it takes it, else runs after it in torch."""
    calls = []

    def fake_linear(x, w, layout, bias, act):
        calls.append(act)
        if act not in (None, "silu"):
            return None
        h = torch.nn.functional.linear(x, w, bias) if layout == "col" else x @ w
        return torch.nn.functional.silu(h) if act == "silu" else h

    for name in ("swiglu_up", "matmul_bias_gelu", "linear_residual"):
        w = example(name)
        fn, _ = B.torch_function(w, linear_fn=fake_linear)
        data = random_inputs(w, SMALL, seed=2)
        got = fn(as_torch(data))["y"].float().numpy()
        assert rel_error(got, reference(w, data, SMALL)["y"]) < 1e-2
    assert "silu" in calls and "gelu_tanh" in calls and None in calls


def test_the_gpu_worker_builds_the_family_baselines():
    from gpuworker.baselines import make_torch_baseline

    w = example("matmul_bias_gelu")
    fn, version, config = make_torch_baseline("torch_eager", w, family="matmul")
    assert version == torch.__version__
    assert config["function"].startswith('y = F.gelu(F.linear(x, w, bias), approximate="tanh")')
    data = random_inputs(w, SMALL, seed=9)
    got = fn(as_torch(data))["y"].float().numpy()
    assert rel_error(got, reference(w, data, SMALL)["y"]) < 1e-2
    _, _, config = make_torch_baseline("torch_compile_max_autotune", w, family="matmul")
    assert config["torch_compile"]["mode"] == "max-autotune-no-cudagraphs"
    assert "F.linear" in config["function"]
    if importlib.util.find_spec("triton") is None:
        with pytest.raises(BaselineUnavailable, match="triton"):
            make_torch_baseline("triton", w, family="matmul")


def test_a_product_of_expressions_is_translated_op_by_op():
    inputs = {"x": (["M", "K"], "bf16"), "w": (["N", "K"], "bf16"), "s": (["K"], "bf16")}
    w = manifest("(x * s) @ w.T", inputs)
    fn, how = B.idiomatic("torch_eager", w, compiled=False)
    assert "((x * s) @ w.mT)" in how
    data = random_inputs(w, SMALL, seed=3)
    got = fn(as_torch(data))["y"].float().numpy()
    assert rel_error(got, reference(w, data, SMALL)["y"]) < 1e-2
