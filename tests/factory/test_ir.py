"""Lowering real manifests (the catalogue and customer-style ones) to the kernel IR."""

from __future__ import annotations

import pytest

from factory import families
from factory.families.row.ir import ROLE_COL, ROLE_ROW, ROLE_ROWSCALAR, Unsupported, lower
from factory.spec import load_catalogue, load_manifest

TEMP_SOFTMAX = """
name = "temp_softmax"
description = "Softmax over the last axis at a per-row temperature, 3-d input."
target = "sm_90"

[inputs.x]
shape = ["B", "T", "N"]
dtype = "bf16"

[inputs.temp]
shape = ["B", "T", 1]
dtype = "fp32"
range = [0.5, 2.0]

[let]
z = "x / temp"
m = "max(z, axis=-1, keepdims=True)"

[outputs.y]
expr = "exp(z - m) / sum(exp(z - m), axis=-1, keepdims=True)"
dtype = "bf16"
shape = ["B", "T", "N"]

[[shapes]]
B = 8
T = 512
N = 4096
"""

COLUMN_SUM = """
name = "column_sum"
description = "Sum down the columns: a reduction along the batch axis."
target = "sm_90"

[inputs.x]
shape = ["M", "N"]
dtype = "fp32"

[outputs.y]
expr = "sum(x, axis=0)"
dtype = "fp32"
shape = ["N"]

[[shapes]]
M = 1024
N = 1024
"""


def row_shaped_catalogue():
    """The catalogue operators of the row family and of the families that refine its shape (flat:
    elementwise, rowsplit: few long rows), all of which the row IR lowers; attention, matmul and
    the other families lower to IRs of their own."""
    return {
        name: w
        for name, w in load_catalogue().items()
        if families.name_for(w, default="none") in ("row", "flat", "rowsplit")
    }


def test_every_row_shaped_catalogue_operator_lowers():
    cat = row_shaped_catalogue()
    assert len(cat) >= 16
    for name, w in cat.items():
        ir = lower(w)
        assert ir.row_dim in w.shapes[0], name
        assert ir.num_stages >= 1


def test_the_catalogue_roles_and_stages_come_from_the_dag_not_the_name():
    cat = load_catalogue()
    ln = lower(cat["layernorm"])
    assert [t.role for t in ln.inputs] == [ROLE_ROW, ROLE_COL, ROLE_COL]
    assert ln.num_stages == 3 and ln.online == []
    ce = lower(cat["cross_entropy"])
    assert ce.row_dim == "V" and [t.role for t in ce.inputs] == [ROLE_ROW, ROLE_ROWSCALAR]
    assert len(ce.gathers) == 1 and len(ce.online) == 1
    assert lower(cat["silu_mul"]).reductions == []
    assert len(lower(cat["log_softmax"]).online) == 1


def test_the_fp32_tolerance_of_the_outputs_decides_the_strictness():
    cat = load_catalogue()
    assert lower(cat["cross_entropy"]).tolerance_rel_norm == pytest.approx(1e-5)
    assert lower(cat["softmax"]).tolerance_rel_norm == pytest.approx(1e-2)


def test_a_customer_expression_with_two_batch_dims_and_a_per_row_scalar_lowers():
    ir = lower(load_manifest(TEMP_SOFTMAX))
    assert ir.batch_dims == ("B", "T") and ir.row_dim == "N"
    assert {t.name: t.role for t in ir.inputs} == {"x": ROLE_ROW, "temp": ROLE_ROWSCALAR}
    assert len(ir.online) == 1  # sum(exp(z - max z)) is spotted on the customer's own z


def test_a_reduction_down_the_columns_is_refused_with_a_reason():
    with pytest.raises(Unsupported) as e:
        lower(load_manifest(COLUMN_SUM))
    assert "row kernel" in str(e.value) or "last axis" in str(e.value)
