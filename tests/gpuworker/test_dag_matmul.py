"""The expression-DAG baseline translates matrix products (a @ w.T) to torch, so a matmul
workload searched only through edits of the customer's kernel still has a torch baseline."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from factory.spec import load_manifest, random_inputs, reference  # noqa: E402
from gpuworker.baselines import dag_function  # noqa: E402

MANIFEST = """
name = "linear_bias_silu"
[inputs.x]
shape = ["M", "K"]
dtype = "fp32"
[inputs.w]
shape = ["N", "K"]
dtype = "fp32"
[inputs.bias]
shape = ["N"]
dtype = "fp32"
[outputs.y]
expr = "(x @ w.T + bias) * sigmoid(x @ w.T + bias)"
dtype = "fp32"
[[shapes]]
M = 5
N = 7
K = 16
"""


def test_the_dag_baseline_computes_a_product_with_its_epilogue_as_the_reference_does():
    try:
        w = load_manifest(MANIFEST)
    except Exception as e:  # noqa: BLE001 - the language must take this manifest
        pytest.fail(f"manifest refused: {e}")
    dims = {"M": 5, "N": 7, "K": 16}
    inputs = random_inputs(w, dims, seed=3)
    want = reference(w, inputs, dims)
    got = dag_function(w)({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in inputs.items()})
    np.testing.assert_allclose(got["y"].double().numpy(), want["y"], rtol=1e-4, atol=1e-5)
