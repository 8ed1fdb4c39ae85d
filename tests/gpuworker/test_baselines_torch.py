"""The torch baselines on the CPU (where torch is installed; the test extra pins the CPU build):
the expression translation agrees with the idiomatic torch call, and torch.compile sees a graph
with every constant folded in, as a customer's own code would give it."""

import pytest

torch = pytest.importorskip("torch")

from factory import families  # noqa: E402
from factory.families.row.baselines import idiomatic_function, op_roles  # noqa: E402
from factory.spec import load_catalogue, load_manifest  # noqa: E402
from gpuworker.baselines import (  # noqa: E402
    Unavailable,
    dag_function,
    make_torch_baseline,
)

# the row-shaped operators (the row, flat and split-row families'), whose inputs _inputs sizes
# as M rows of n; the attention and matmul families' baselines are tested in their own files
CATALOGUE = {
    name: w
    for name, w in load_catalogue().items()
    if families.name_for(w, default="none") in ("row", "flat", "rowsplit")
}


def _inputs(w, m=8, n=257, seed=0):
    g = torch.Generator().manual_seed(seed)
    ins = {}
    for t in w.inputs:
        shape = [m if d == "M" else n for d in t.shape]
        if t.dtype in ("int32", "int64"):
            hi = 2 if t.name == "keep" else n
            dt = torch.int64 if t.dtype == "int64" else torch.int32
            ins[t.name] = torch.randint(0, hi, shape, generator=g, dtype=dt)
        else:
            dt = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(t.dtype, torch.float32)
            ins[t.name] = torch.randn(shape, generator=g).to(dt)
    return ins


def _graphs(fn, ins):
    """Compile `fn` with a backend that keeps dynamo's FX graphs, run it once."""
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(fn, backend=keep, dynamic=False)(ins)
    return graphs, out


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_the_compiled_expression_is_one_graph_with_its_constants_folded(name):
    # Constants made with torch.tensor(...) on the first call and cached gave two graphs: the
    # first created a tensor per call (on the GPU an extra kernel, inductor's lift_fresh), the
    # second, compiled when dynamo saw the cache change, read the constant from memory.
    w = CATALOGUE[name]
    fn, ins = dag_function(w), _inputs(w)
    graphs, compiled = _graphs(fn, ins)
    assert len(graphs) == 1, "one graph, no break"
    fn(ins)
    again = torch.compile(fn, backend=lambda gm, ex: graphs.append(gm) or gm.forward)
    again(ins)
    again(ins)
    assert len(graphs) == 2, "a second and third call compile nothing more"
    made = [
        str(n.target)
        for n in graphs[0].graph.nodes
        if n.op == "call_function" and any(k in str(n.target) for k in ("tensor", "lift", "full"))
    ]
    assert made == []
    eager = fn(ins)
    for k, v in eager.items():
        assert torch.equal(compiled[k], v), k


@pytest.mark.parametrize("name", sorted(n for n in CATALOGUE if op_roles(CATALOGUE[n])))
def test_the_expression_agrees_with_the_torch_call_a_customer_would_make(name):
    w = CATALOGUE[name]
    fn, how = idiomatic_function(w)
    if fn is None:
        assert op_roles(w).kind == "relu2", how  # no torch function for it
        return
    ins = _inputs(w)
    lib, dag = fn(ins), dag_function(w)(ins)
    assert set(lib) == set(dag) == {o.name for o in w.outputs}
    for k in lib:
        assert lib[k].dtype == dag[k].dtype, k
        # bf16 outputs: a rounding step apart at most (the two sum in different orders)
        torch.testing.assert_close(lib[k].float(), dag[k].float(), rtol=1.6e-2, atol=1e-2)


def _custom(expr):
    return load_manifest(
        'name = "t"\ntarget = "sm_90"\n[inputs.x]\nshape = ["M", "N"]\ndtype = "bf16"\n'
        f'[outputs.y]\nexpr = "{expr}"\ndtype = "fp32"\nshape = ["M", "N"]\n'
        "[[shapes]]\nM = 4\nN = 64\n"
    )


@pytest.mark.parametrize(
    ("expr", "expect"),
    [
        ("min(max(x, 0.0), 6.0)", lambda x: x.clamp(0.0, 6.0)),
        ("max(0.5, x) - min(-0.5, x)", lambda x: x.clamp(min=0.5) - x.clamp(max=-0.5)),
        ("where(x > 1.0, 2.0, 0.01 * x)", lambda x: torch.where(x > 1.0, 2.0, 0.01 * x)),
        ("exp(1.0) * x + sqrt(2.0)", lambda x: torch.tensor(1.0).exp() * x + 2.0**0.5),
        ("bf16(0.1) * x", lambda x: torch.tensor(0.1).to(torch.bfloat16).float() * x),
        ("1.0 / (1.0 + exp(-x))", torch.sigmoid),
    ],
)
def test_constants_and_constant_sub_expressions_in_a_customer_expression(expr, expect):
    w = _custom(expr)
    ins = _inputs(w)
    x = ins["x"].float()
    fn = dag_function(w)
    torch.testing.assert_close(fn(ins)["y"], expect(x), rtol=1e-6, atol=1e-6)
    graphs, compiled = _graphs(fn, ins)
    assert len(graphs) == 1  # exp(1.0), bf16(0.1): folded before the call, no graph break
    assert torch.equal(compiled["y"], fn(ins)["y"])


def test_the_library_baselines_say_why_they_are_missing_here():
    import importlib.util

    w = CATALOGUE["softmax"]
    f, version, config = make_torch_baseline("torch_eager", w)
    assert version == torch.__version__ and config["function"] == "F.softmax(x, dim=-1)"
    for name, module in (("triton", "triton"), ("liger", "liger_kernel")):
        if importlib.util.find_spec(module) is None:
            with pytest.raises(Unavailable, match="not importable"):
                make_torch_baseline(name, w)
        else:
            f, version, config = make_torch_baseline(name, w)
            assert callable(f) and version and config["kernel"]
    with pytest.raises(Unavailable, match="no plain Triton kernel|not importable"):
        make_torch_baseline("triton", CATALOGUE["gelu_tanh"])
