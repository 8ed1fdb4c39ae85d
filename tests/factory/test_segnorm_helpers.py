"""Shared by the segnorm tests: instance norm's manifest over H and W at N 2, C 3, H 16, W 16,
with its output expression, its variance and its dtypes as arguments."""

from __future__ import annotations

VAR = "mean((x - mu) ** 2, axis=(2, 3), keepdims=True)"
NORM = "(x - mu) * rsqrt(var + eps)"

_M = """
name = "inorm"
[inputs.x]
shape = ["N", "C", "H", "W"]
dtype = "{dt}"
[constants]
eps = 1e-5
[let]
mu = "mean(x, axis=(2, 3), keepdims=True)"
var = "{var}"
[outputs.y]
expr = "{expr}"
dtype = "{odt}"
[[shapes]]
N = 2
C = 3
H = 16
W = 16
"""


def inorm_manifest(expr: str = NORM, dt: str = "fp32", odt: str = "fp32", var: str = VAR) -> str:
    return _M.format(expr=expr, dt=dt, odt=odt, var=var)
