"""The one classification the library baselines (torch, Triton, Liger) read: which catalogue
operator a workload is, and which tensor plays which part. Pure Python, no torch."""

import pytest

from factory.families.row.baselines import op_roles
from factory.spec import load_catalogue, load_manifest

EXPECTED = {
    "add_rmsnorm": ("add_rmsnorm", {"x": "x", "r": "r", "w": "w"}, {"h": "h", "y": "y"}),
    "cross_entropy": ("cross_entropy", {"logits": "logits", "target": "target"}, {"y": "loss"}),
    "gelu_erf": ("gelu", {"x": "x"}, {"y": "y"}),
    "gelu_tanh": ("gelu", {"x": "x"}, {"y": "y"}),
    "layernorm": ("layernorm", {"x": "x", "w": "weight", "b": "bias"}, {"y": "y"}),
    "log_softmax": ("log_softmax", {"x": "x"}, {"y": "y"}),
    "relu2": ("relu2", {"x": "x"}, {"y": "y"}),
    "rmsnorm": ("rmsnorm", {"x": "x", "w": "w"}, {"y": "y"}),
    "silu_mul": ("silu_mul", {"a": "a", "b": "b"}, {"y": "y"}),
    "softmax": ("softmax", {"x": "x"}, {"y": "y"}),
}


@pytest.mark.parametrize("name", sorted(load_catalogue()))
def test_every_catalogue_operator_is_classified_as_itself_or_left_to_the_expression(name):
    op = op_roles(load_catalogue()[name])
    if name not in EXPECTED:  # l2norm, masked_softmax, row_max, row_sum: no library call
        assert op is None
        return
    kind, inputs, outputs = EXPECTED[name]
    assert op.kind == kind
    assert op.inputs == inputs
    assert {role: o.name for role, o in op.outputs.items()} == outputs


def test_norms_carry_their_epsilon_and_gelu_its_approximation():
    cat = load_catalogue()
    for name in ("rmsnorm", "layernorm", "add_rmsnorm"):
        eps = op_roles(cat[name]).eps
        assert eps is not None and 0 < eps < 1e-2, (name, eps)
    assert op_roles(cat["gelu_tanh"]).approximate == "tanh"
    assert op_roles(cat["gelu_erf"]).approximate == "none"


def _variant(name, old, new):
    from factory.spec import catalogue_manifest

    text = catalogue_manifest(name)
    assert old in text, (name, old)
    return load_manifest(text.replace(old, new, 1))


def test_a_name_alone_does_not_make_an_operator():
    # An RMSNorm by name whose expression has no epsilon is not F.rms_norm: left to the DAG.
    from factory.spec import catalogue_manifest

    text = catalogue_manifest("rmsnorm")
    consts = [c for c in ("1e-6", "1e-5", "1e-06", "1e-05") if c in text]
    assert consts, "the catalogue RMSNorm names its epsilon"
    no_eps = load_manifest(text.replace(consts[0], "0.5"))
    assert op_roles(no_eps) is None
    # A softmax renamed is an unknown operator.
    assert op_roles(_variant("softmax", 'name = "softmax"', 'name = "my_op"')) is None
    # Aliases a customer may use are recognised.
    assert op_roles(_variant("softmax", 'name = "softmax"', 'name = "softmax-lastdim"')).kind == (
        "softmax"
    )
