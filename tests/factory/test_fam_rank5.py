"""Rank-5 tensors (issue 50: views of higher-rank tensors without copying): the families view
any run of axes as one, so a 5-D operand reduces, scans and pools as its flattened view would,
checked in factory.ptxsim against the float64 reference."""

from __future__ import annotations

import pytest
from test_fam_helpers import run_and_check

from factory import families
from factory.spec import load_manifest
from factory.spec.manifest import with_pooled_dims

M = """
name = "r5"
[inputs.x]
shape = ["A", "B", "C", "D", "E"]
dtype = "bf16"
[outputs.y]
expr = "{expr}"
dtype = "{odt}"
[[shapes]]
A = 2
B = 3
C = 4
D = 5
E = 6
"""
DIMS = {"A": 2, "B": 3, "C": 3, "D": 5, "E": 6}


@pytest.mark.parametrize(
    "expr, odt, fam",
    [
        ("sum(x, axis=(1, 2))", "fp32", "colreduce"),
        ("mean(x, axis=(0, 3, 4))", "fp32", "segreduce"),
        ("max(x, axis=(2, 3, 4))", "bf16", "segreduce"),
        ("sum(x * x, axis=None)", "fp32", "allreduce"),
        ("cumsum(x, axis=2)", "fp32", "scan"),
        ("cumsum(x, axis=-1, reverse=True)", "fp32", "scan"),
        ("argmax(x, axis=1)", "int64", "argreduce"),
        ("argmin(x, axis=-1)", "int32", "argreduce"),
        ("maxpool(x, window=(2, 3), stride=1, padding=1)", "bf16", "pool"),
    ],
)
def test_rank_five_operands(expr, odt, fam):
    w = load_manifest(M.format(expr=expr, odt=odt))
    family, ir = families.family_for(w)
    assert family.name == fam
    dims = with_pooled_dims(w.outputs, DIMS)
    run_and_check(family, w, family.default_schedule(ir, dims), dims, seed=1)
