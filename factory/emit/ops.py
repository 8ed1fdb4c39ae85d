"""Elementwise operations: a table from IR op to a small function that prints its PTX.

Every value is computed in f32 (bf16/fp16 are storage formats). Each function takes the builder,
the operand registers and the `fast_math` flag, and returns the result register. Exponentials use
ex2.approx (about 2 ulp, far inside any fp32 tolerance we accept); `fast_math` only switches the
operations whose approximate forms are coarser (division, sqrt, tanh) and is allowed by the
schedule only where the output tolerance is loose (bf16/fp16 outputs).
"""

from __future__ import annotations

from collections.abc import Callable

from factory.emit.ptx import LN2, LOG2E, Builder, EmitError, f32_literal


def _exp(b: Builder, x: str, fast: bool) -> str:
    t = b.reg("f32")
    b.op(f"mul.f32 {t}, {x}, {f32_literal(LOG2E)}")
    r = b.reg("f32")
    b.op(f"ex2.approx.ftz.f32 {r}, {t}")
    return r


def _log(b: Builder, x: str, fast: bool) -> str:
    t = b.reg("f32")
    b.op(f"lg2.approx.ftz.f32 {t}, {x}")
    r = b.reg("f32")
    b.op(f"mul.f32 {r}, {t}, {f32_literal(LN2)}")
    return r


def _sqrt(b: Builder, x: str, fast: bool) -> str:
    r = b.reg("f32")
    b.op(f"sqrt.{'approx.ftz' if fast else 'rn'}.f32 {r}, {x}")
    return r


def _rsqrt(b: Builder, x: str, fast: bool) -> str:
    r = b.reg("f32")
    if fast:
        b.op(f"rsqrt.approx.ftz.f32 {r}, {x}")
    else:
        s = _sqrt(b, x, False)
        b.op(f"rcp.rn.f32 {r}, {s}")
    return r


def rcp(b: Builder, x: str, fast: bool) -> str:
    r = b.reg("f32")
    b.op(f"rcp.{'approx.ftz' if fast else 'rn'}.f32 {r}, {x}")
    return r


def _div(b: Builder, x: str, y: str, fast: bool) -> str:
    r = b.reg("f32")
    b.op(f"div.{'full' if fast else 'rn'}.f32 {r}, {x}, {y}")
    return r


def _tanh(b: Builder, x: str, fast: bool) -> str:
    r = b.reg("f32")
    if fast:
        # tanh.approx: max relative error about 2^-11, fine for bf16/fp16 outputs.
        b.op(f"tanh.approx.f32 {r}, {x}")
        return r
    # Precise: 1 - 2/(exp(2|x|)+1) with the sign put back; an odd polynomial near 0, where
    # that form cancels (Taylor to x^9 is within 6e-8 relative for |x| < 0.3).
    a = b.reg("f32")
    b.op(f"abs.f32 {a}, {x}")
    e = _exp(b, a, fast)  # exp(|x|)
    e2 = b.reg("f32")
    b.op(f"mul.f32 {e2}, {e}, {e}")
    d = b.reg("f32")
    b.op(f"add.f32 {d}, {e2}, 0f3F800000")
    q = b.reg("f32")
    b.op(f"div.rn.f32 {q}, 0f40000000, {d}")
    big = b.reg("f32")
    b.op(f"sub.f32 {big}, 0f3F800000, {q}")
    big_s = b.reg("f32")
    b.op(f"copysign.f32 {big_s}, {x}, {big}")
    x2 = b.reg("f32")
    b.op(f"mul.f32 {x2}, {x}, {x}")
    coeffs = [62.0 / 2835.0, -17.0 / 315.0, 2.0 / 15.0, -1.0 / 3.0, 1.0]
    p = b.reg("f32")
    b.op(f"mov.f32 {p}, {f32_literal(coeffs[0])}")
    for c in coeffs[1:]:
        p2 = b.reg("f32")
        b.op(f"fma.rn.f32 {p2}, {p}, {x2}, {f32_literal(c)}")
        p = p2
    small = b.reg("f32")
    b.op(f"mul.f32 {small}, {p}, {x}")
    pr = b.reg("pred")
    b.op(f"setp.lt.f32 {pr}, {a}, 0f3E99999A")
    b.op(f"selp.f32 {r}, {small}, {big_s}, {pr}")
    return r


def _sigmoid(b: Builder, x: str, fast: bool) -> str:
    t = b.reg("f32")
    b.op(f"mul.f32 {t}, {x}, {f32_literal(-LOG2E)}")
    e = b.reg("f32")
    b.op(f"ex2.approx.ftz.f32 {e}, {t}")
    d = b.reg("f32")
    b.op(f"add.f32 {d}, {e}, 0f3F800000")
    return rcp(b, d, fast)


def _erf(b: Builder, x: str, fast: bool) -> str:
    # Abramowitz & Stegun 7.1.26: |error| <= 1.5e-7 absolute for every x; odd symmetry.
    a = b.reg("f32")
    b.op(f"abs.f32 {a}, {x}")
    den = b.reg("f32")
    b.op(f"fma.rn.f32 {den}, {a}, {f32_literal(0.3275911)}, 0f3F800000")
    t = rcp(b, den, False)
    coeffs = [1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592]
    p = b.reg("f32")
    b.op(f"mov.f32 {p}, {f32_literal(coeffs[0])}")
    for c in coeffs[1:]:
        p2 = b.reg("f32")
        b.op(f"fma.rn.f32 {p2}, {p}, {t}, {f32_literal(c)}")
        p = p2
    pt = b.reg("f32")
    b.op(f"mul.f32 {pt}, {p}, {t}")
    nx2 = b.reg("f32")
    b.op(f"mul.f32 {nx2}, {a}, {a}")
    b.op(f"neg.f32 {nx2}, {nx2}")
    e = _exp(b, nx2, fast)
    y = b.reg("f32")
    b.op(f"mul.f32 {y}, {pt}, {e}")
    one_minus = b.reg("f32")
    b.op(f"sub.f32 {one_minus}, 0f3F800000, {y}")
    r = b.reg("f32")
    b.op(f"copysign.f32 {r}, {x}, {one_minus}")
    return r


def _simple_unary(instr: str) -> Callable[[Builder, str, bool], str]:
    def f(b: Builder, x: str, fast: bool) -> str:
        r = b.reg("f32")
        b.op(f"{instr} {r}, {x}")
        return r

    return f


UNARY: dict[str, Callable[[Builder, str, bool], str]] = {
    "neg": _simple_unary("neg.f32"),
    "abs": _simple_unary("abs.f32"),
    "exp": _exp,
    "log": _log,
    "sqrt": _sqrt,
    "rsqrt": _rsqrt,
    "tanh": _tanh,
    "sigmoid": _sigmoid,
    "erf": _erf,
}


def _simple_binary(instr: str) -> Callable[[Builder, str, str, bool], str]:
    def f(b: Builder, x: str, y: str, fast: bool) -> str:
        r = b.reg("f32")
        b.op(f"{instr} {r}, {x}, {y}")
        return r

    return f


BINARY: dict[str, Callable[[Builder, str, str, bool], str]] = {
    "add": _simple_binary("add.f32"),
    "sub": _simple_binary("sub.f32"),
    "mul": _simple_binary("mul.f32"),
    "max": _simple_binary("max.f32"),
    "min": _simple_binary("min.f32"),
    "div": _div,
}


def pow_const(b: Builder, x: str, exponent: float, fast: bool) -> str:
    """x ** c for a constant c: repeated products for small integers, else exp2(c*log2 x)."""
    if exponent == 1.0:
        return x
    if exponent == 0.5:
        return _sqrt(b, x, fast)
    if exponent == -0.5:
        return _rsqrt(b, x, fast)
    if exponent == float(int(exponent)) and 0 <= exponent <= 8:
        if exponent == 0:
            return b.const_f32(1.0)
        acc = x
        for _ in range(int(exponent) - 1):
            r = b.reg("f32")
            b.op(f"mul.f32 {r}, {acc}, {x}")
            acc = r
        return acc
    if exponent == float(int(exponent)) and -8 <= exponent < 0:
        return rcp(b, pow_const(b, x, -exponent, fast), fast)
    lg = b.reg("f32")
    b.op(f"lg2.approx.ftz.f32 {lg}, {x}")
    t = b.reg("f32")
    b.op(f"mul.f32 {t}, {lg}, {f32_literal(exponent)}")
    r = b.reg("f32")
    b.op(f"ex2.approx.ftz.f32 {r}, {t}")
    return r


# setp comparison names; "ne" is unordered so NaN != x is true, as in numpy.
COMPARE = {"lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "eq": "eq", "ne": "neu"}


def compare(b: Builder, op: str, x: str, y: str) -> str:
    if op not in COMPARE:
        raise EmitError(f"no PTX comparison for {op}")
    p = b.reg("pred")
    b.op(f"setp.{COMPARE[op]}.f32 {p}, {x}, {y}")
    return p


def cast_round(b: Builder, x: str, to: str) -> str:
    """Round x to a storage dtype and widen back to f32 (models a store and reload)."""
    if to == "fp32":
        return x
    h = b.reg("b16")
    r = b.reg("f32")
    if to == "bf16":
        b.op(f"cvt.rn.bf16.f32 {h}, {x}")
        b.op(f"cvt.f32.bf16 {r}, {h}")
    elif to == "fp16":
        b.op(f"cvt.rn.f16.f32 {h}, {x}")
        b.op(f"cvt.f32.f16 {r}, {h}")
    else:
        raise EmitError(f"cannot round to {to}")
    return r
