"""On the GPU: every library baseline (torch eager, the plain Triton kernels, Liger Kernel where
it is installed) for every catalogue operator it covers passes the worker's float64 check
(held-out shapes included) and is timed, and it calls the library function its classification
(`factory.families.row.baselines.op_roles`) names. A baseline that fails verification would
drop out of "best baseline" and flatter us."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

pytestmark = pytest.mark.gpu

LIGER_OPS = ("softmax", "rmsnorm", "add_rmsnorm", "layernorm", "silu_mul", "relu2", "cross_entropy")
TRITON_OPS = ("softmax", "rmsnorm")


def _catalogue_names():
    """The row-shaped catalogue operators (the row, flat and split-row families'), sized below
    by their row count M; the attention and matmul baselines have GPU tests of their own."""
    from factory import families
    from factory.spec import load_catalogue

    return sorted(
        name
        for name, w in load_catalogue().items()
        if families.name_for(w, default="none") in ("row", "flat", "rowsplit")
    )


CASES = (
    [("liger", op) for op in LIGER_OPS]
    + [("triton", op) for op in TRITON_OPS]
    + [("torch_eager", op) for op in _catalogue_names()]
    # torch.compile of the expression translation (add+RMSNorm's compiled baseline, and every
    # operator without a torch function): one graph, its constants folded in
    + [
        ("torch_compile", op)
        for op in ("add_rmsnorm", "relu2", "l2norm", "masked_softmax", "row_max", "row_sum")
    ]
)


def _run(baseline, name):
    from gpuworker_catalogue_batch import catalogue_batch

    from factory.spec import load_catalogue
    from gpuworker import run_batch

    first = dict(load_catalogue()[name].shapes[0])
    shapes = [{d: (96 if d == "M" else v) for d, v in first.items()}]
    w, batch = catalogue_batch(name, shapes, [baseline], 0.05, candidates=1)
    (b,) = run_batch(batch)["baselines"]
    return w, b


@pytest.mark.parametrize(("baseline", "name"), CASES)
def test_library_baseline_is_verified_and_timed(baseline, name):
    pytest.importorskip("torch")
    if baseline == "liger":
        pytest.importorskip("liger_kernel")
    from factory.families.row.baselines import op_roles

    w, b = _run(baseline, name)
    assert b["name"] == baseline and b["version"], b
    assert b["status"] == "passed", b["reason"]
    assert b["verification"] and all(v["passed"] for v in b["verification"])
    assert any(v["heldout"] for v in b["verification"])
    assert b["timing"] and b["timing"][0]["median_us"] > 0
    how = b["config"].get("function") or b["config"].get("kernel", "")
    op = op_roles(w)
    if baseline == "torch_compile":
        assert "expression DAG" in how and b["config"]["torch_compile"]["mode"] == "default", how
    elif baseline == "torch_eager":
        # The catalogue operators torch has a function for are called through it; the rest
        # (squared ReLU, l2norm, masked softmax, row max/sum) are the expression, op by op.
        library = op is not None and op.kind != "relu2"
        assert how.startswith(("F.", "h = x + r")) == library, how
        assert ("expression DAG" in how) == (not library), how
    else:
        assert how and op is not None, (how, op)
