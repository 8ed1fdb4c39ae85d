"""The float64 reference, random inputs and the storage formats.

Storage form (what kernels read and write): fp32 -> float32, fp16 -> float16, bf16 -> uint16 (the
raw bits), int32/int64 as is. The reference decodes inputs to float64, evaluates the node DAG once
per node, frees each intermediate after its last use and reuses dying buffers in place, so a
16384 x 8192 operator needs about one float64 copy of each input and little more."""

from __future__ import annotations

import math

import numpy as np

from factory.spec.expr import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    ArgReduce,
    Attention,
    Binary,
    Cast,
    Compare,
    Const,
    Gather,
    Input,
    MatMul,
    Node,
    Pool,
    Reduce,
    Scan,
    Transpose,
    Unary,
    Where,
    children,
    walk,
)
from factory.spec.types import SpecError, Workload

STORAGE_DTYPES = {
    "fp32": np.dtype(np.float32),
    "fp16": np.dtype(np.float16),
    "bf16": np.dtype(np.uint16),
    "fp8e4m3": np.dtype(np.uint8),  # the raw bits, as bf16's
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
}

_CHUNK = 1 << 20  # elements per block in the blocked kernels below (fits in L2)


# -- storage conversions ------------------------------------------------------------------------


def _f32_to_bf16_bits(f: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits, round to nearest even; NaN stays a quiet NaN, overflow goes to inf."""
    u = np.ascontiguousarray(f, dtype=np.float32).view(np.uint32)
    out = np.empty(u.shape, dtype=np.uint16)
    flat_u, flat_o = u.reshape(-1), out.reshape(-1)
    for s in range(0, flat_u.size, _CHUNK):
        b = flat_u[s : s + _CHUNK]
        r = (b >> 16) & 1
        r += 0x7FFF
        r += b
        r >>= 16
        nan = (b & 0x7FFFFFFF) > 0x7F800000
        if nan.any():
            r[nan] = (b[nan] >> 16) | 0x0040
        flat_o[s : s + _CHUNK] = r
    return out


def _f64_to_f32_round_to_odd(a: np.ndarray) -> np.ndarray:
    """float64 -> float32 rounding to odd: rounding that result again to bf16 (8 bits) equals
    rounding the float64 value to bf16 directly, so casts never double-round."""
    with np.errstate(over="ignore", invalid="ignore"):
        f = a.astype(np.float32)
        back = f.astype(np.float64)
        inexact = back != a
        inexact &= ~np.isnan(a)
    if inexact.any():
        bits = f.view(np.uint32)
        too_big = np.abs(back) > np.abs(a)
        bits[inexact & too_big] -= 1  # step toward zero: sign-magnitude bits shrink by one
        bits[inexact] |= 1
    return f


FP8_E4M3_MAX = 448.0


def _f64_to_e4m3_bits(a: np.ndarray) -> np.ndarray:
    """float64 -> fp8 e4m3 bits (OCP "e4m3fn"), rounding to nearest even once, saturating to
    +-448 (infinities too); NaN -> 0x7F (with the sign bit of the NaN)."""
    a = np.asarray(a, dtype=np.float64)
    sign = np.signbit(a).astype(np.uint8) << 7
    nan = np.isnan(a)
    x = np.minimum(np.abs(np.where(nan, 0.0, a)), FP8_E4M3_MAX)
    _, ex = np.frexp(x)  # x = m * 2^ex, m in [0.5, 1): the binade's exponent is ex - 1
    e = np.clip(ex.astype(np.int64) - 1, -6, 8)  # below 2^-6 the subnormal step 2^-9 holds
    step = np.ldexp(1.0, e - 3)
    r = np.round(x / step) * step  # exact division by a power of two; ties to even
    _, rex = np.frexp(r)
    re = rex.astype(np.int64) - 1
    normal = r >= 2.0**-6
    exp_field = np.where(normal, re + 7, 0)
    mant = np.where(normal, r / np.ldexp(1.0, re) * 8 - 8, r / 2.0**-9)
    bits = (exp_field << 3) | np.rint(mant).astype(np.int64)
    out = bits.astype(np.uint8) | sign
    return np.where(nan, np.uint8(0x7F) | sign, out).astype(np.uint8)


def _e4m3_bits_to_f64(bits: np.ndarray) -> np.ndarray:
    b = np.asarray(bits, dtype=np.uint8).astype(np.int64)
    e, m = (b >> 3) & 15, b & 7
    v = np.where(e == 0, m * 2.0**-9, (1.0 + m / 8.0) * np.ldexp(1.0, e - 7))
    v = np.where((e == 15) & (m == 7), np.nan, v)
    return np.where(b & 0x80, -v, v)


def to_storage(arr: np.ndarray, dtype: str) -> np.ndarray:
    """float64 (or float32) values -> the storage form of `dtype`, rounding to nearest even
    (bf16 from float64 is rounded once, exactly). Index dtypes round to the nearest integer.
    Raises SpecError for an unknown dtype."""
    a = np.asarray(arr)
    if dtype == "fp32":
        return a.astype(np.float32)
    if dtype == "fp16":
        with np.errstate(over="ignore"):
            return a.astype(np.float16)
    if dtype == "bf16":
        if a.dtype == np.float32:
            return _f32_to_bf16_bits(a)
        return _f32_to_bf16_bits(_f64_to_f32_round_to_odd(a.astype(np.float64, copy=False)))
    if dtype == "fp8e4m3":
        return _f64_to_e4m3_bits(a)
    if dtype in INDEX_DTYPES:
        return np.rint(a).astype(STORAGE_DTYPES[dtype])
    raise SpecError([("dtype", f"unknown dtype {dtype!r}")])


def to_float64(arr: np.ndarray, dtype: str) -> np.ndarray:
    """Storage form of `dtype` -> a new float64 array (bf16 bits decoded exactly).
    Raises SpecError when the array's numpy dtype is not the storage form of `dtype`."""
    a = np.asarray(arr)
    want = STORAGE_DTYPES.get(dtype)
    if want is None:
        raise SpecError([("dtype", f"unknown dtype {dtype!r}")])
    if dtype == "bf16":
        if a.dtype not in (np.uint16, np.int16):
            raise SpecError([("dtype", f"bf16 data must be uint16 bits, not {a.dtype}")])
        wide = a.view(np.uint16).astype(np.uint32)
        wide <<= 16
        with np.errstate(invalid="ignore"):  # NaN payloads are fine
            return wide.view(np.float32).astype(np.float64)
    if dtype == "fp8e4m3":
        if a.dtype not in (np.uint8, np.int8):
            raise SpecError([("dtype", f"fp8e4m3 data must be uint8 bits, not {a.dtype}")])
        return _e4m3_bits_to_f64(a.view(np.uint8))
    if a.dtype != want and not (dtype in INDEX_DTYPES and a.dtype.kind in "iu"):
        raise SpecError([("dtype", f"{dtype} data must be {want}, not {a.dtype}")])
    return a.astype(np.float64)


def _round_through(v: np.ndarray, dtype: str) -> np.ndarray:
    """Round float64 values to `dtype` and back: what storing and reloading would give."""
    if dtype == "fp32":
        return v.astype(np.float32).astype(np.float64)
    if dtype == "fp16":
        with np.errstate(over="ignore"):
            return v.astype(np.float16).astype(np.float64)
    if dtype == "fp8e4m3":
        return _e4m3_bits_to_f64(_f64_to_e4m3_bits(v)).reshape(np.shape(v))
    return to_float64(to_storage(v, "bf16"), "bf16").reshape(np.shape(v))  # 0-d stays 0-d


# -- random inputs -------------------------------------------------------------------------------


def concrete_shape(shape, dims: dict[str, int]) -> tuple[int, ...]:
    try:
        return tuple(dims[d] if isinstance(d, str) else d for d in shape)
    except KeyError as e:
        raise SpecError([("dims", f"no size given for dim {e.args[0]!r}")]) from None


def random_inputs(w: Workload, dims: dict[str, int], seed: int) -> dict[str, np.ndarray]:
    """Fresh inputs in storage form, uniform over each input's declared range (index tensors:
    integers in [low, high), high possibly a dim). Each input has its own stream derived from
    (seed, position), so the same seed gives the same data on every host."""
    out = {}
    for i, decl in enumerate(w.inputs):
        shape = concrete_shape(decl.shape, dims)
        rng = np.random.default_rng(np.random.SeedSequence([int(seed) % 2**64, i]))
        if decl.dtype in INDEX_DTYPES:
            high = concrete_shape((decl.high,), dims)[0]
            if high <= decl.low:
                raise SpecError([(f"inputs.{decl.name}.range", f"is empty at {dims}")])
            out[decl.name] = rng.integers(
                int(decl.low), high, size=shape, dtype=STORAGE_DTYPES[decl.dtype]
            )
            continue
        v = rng.random(shape, dtype=np.float32)
        v *= np.float32(decl.high - decl.low)
        v += np.float32(decl.low)
        out[decl.name] = to_storage(v, decl.dtype)
    return out


# -- erf ---------------------------------------------------------------------------------------
# numpy has no erf. Taylor expansion around grid points x0 = k/128, 0 <= x0 <= 6: the k-th
# derivative of erf is (-1)^(k-1) (2/sqrt(pi)) H_(k-1)(x) exp(-x^2) (physicists' Hermite), and
# with |x - x0| <= 1/256 six terms leave an error below 1e-16. Beyond 6, erf is 1 in float64.

_ERF_STEP = 128
_ERF_MAX = 6.0
_ERF_TERMS = 7


def _erf_table() -> np.ndarray:
    x0 = np.arange(int(_ERF_MAX * _ERF_STEP) + 1, dtype=np.float64) / _ERF_STEP
    table = np.empty((x0.size, _ERF_TERMS))
    table[:, 0] = [math.erf(v) for v in x0]
    g = 2.0 / math.sqrt(math.pi) * np.exp(-x0 * x0)
    h_prev, h = np.zeros_like(x0), np.ones_like(x0)  # H_-1 (unused), H_0
    for k in range(1, _ERF_TERMS):
        # d^k/dx^k erf = (-1)^(k-1) g H_(k-1);  H_(n+1) = 2x H_n - 2n H_(n-1)
        table[:, k] = (-1) ** (k - 1) * g * h / math.factorial(k)
        n = k - 1
        h_prev, h = h, 2 * x0 * h - 2 * n * h_prev
    return table


_ERF_COLUMNS = [np.ascontiguousarray(c) for c in _erf_table().T]
_ERF_CHUNK = 1 << 14  # small blocks keep every temporary in cache: 6x faster than 1 << 20


def erf(x: np.ndarray) -> np.ndarray:
    """Vectorised erf in float64, abs error below 2e-16 (NaN stays NaN, erf(+-inf) = +-1)."""
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    xf, of = x.reshape(-1), out.reshape(-1)
    top = len(_ERF_COLUMNS) - 1
    for s in range(0, xf.size, _ERF_CHUNK):
        v = xf[s : s + _ERF_CHUNK]
        a = np.abs(v)
        np.fmin(a, _ERF_MAX, out=a)  # fmin maps NaN to the table's end; fixed below
        kf = a * _ERF_STEP
        np.rint(kf, out=kf)
        k = kf.astype(np.intp)
        d = kf
        d *= -1.0 / _ERF_STEP
        d += a  # d = a - k / step, |d| <= 1 / (2 step)
        r = np.take(_ERF_COLUMNS[top], k)
        for t in range(top - 1, -1, -1):
            r *= d
            r += np.take(_ERF_COLUMNS[t], k)
        np.copysign(r, v, out=r)
        of[s : s + _ERF_CHUNK] = r
    nan = np.isnan(x)
    if nan.any():
        out[nan] = np.nan
    return out


# -- the reference -------------------------------------------------------------------------------


def _as_float(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float64) if v.dtype.kind in "iub" and v.dtype != np.bool_ else v


def reference(
    w: Workload, inputs: dict[str, np.ndarray], dims: dict[str, int]
) -> dict[str, np.ndarray]:
    """Evaluate every output of `w` in float64 on `inputs` (storage form, shapes per `dims`).

    Returns {output name: float64 array of the output's shape}, unrounded (casts inside the
    expression do round, to their storage dtype). Raises SpecError when an input is missing or
    has the wrong shape or dtype, or a gather index is out of range."""
    errors = []
    for decl in w.inputs:
        if decl.name not in inputs:
            errors.append((f"inputs.{decl.name}", "missing"))
            continue
        shape = concrete_shape(decl.shape, dims)
        got = np.shape(inputs[decl.name])
        if got != shape:
            errors.append((f"inputs.{decl.name}", f"has shape {got}, expected {shape}"))
    if errors:
        raise SpecError(errors)
    plan = _row_plan(w, dims)
    if plan is None:
        return _evaluate(w, inputs, dims)
    return _evaluate_in_row_blocks(w, inputs, dims, *plan)


# Large operators are evaluated in blocks of rows on a few threads (numpy's ufuncs release the
# GIL): memory stays near the size of the outputs, and a 16-core GPU host uses its cores. Only
# when it cannot change the result: no reduction or gather runs along the split dim.
_BLOCK_ELEMENTS = 1 << 21  # per block, of the largest input (16 MB per float64 intermediate)
_MIN_SPLIT_ELEMENTS = 1 << 22


def _row_plan(w: Workload, dims: dict[str, int]):
    largest = max(w.inputs, key=lambda d: math.prod(concrete_shape(d.shape, dims)), default=None)
    if largest is None or not largest.shape or not isinstance(largest.shape[0], str):
        return None
    total = math.prod(concrete_shape(largest.shape, dims))
    split = largest.shape[0]
    if total < _MIN_SPLIT_ELEMENTS or dims[split] < 2:
        return None
    nodes = {n for o in w.outputs for n in walk(o.expr)}
    for n in nodes:
        if n.shape.count(split) > 1:
            return None
        if isinstance(n, Reduce | Scan | ArgReduce) and n.x.shape[n.axis] == split:
            return None
        if isinstance(n, Pool) and split in n.x.shape[-len(n.window) :]:
            return None
        if isinstance(n, Gather) and n.x.shape[-1] == split:
            return None
        if isinstance(n, MatMul) and n.a.shape[-1] == split:  # the summed axis
            return None
    for d in w.inputs:
        if d.shape.count(split) > 1 or d.high == split:
            return None
    rows_per_block = max(1, dims[split] * _BLOCK_ELEMENTS // total)
    return split, rows_per_block


def _evaluate_in_row_blocks(w, inputs, dims, split: str, rows_per_block: int):
    import concurrent.futures
    import os

    rows = dims[split]
    outputs = {o.name: np.empty(concrete_shape(o.shape, dims)) for o in w.outputs}

    def block(start: int) -> None:
        stop = min(rows, start + rows_per_block)
        sub_dims = {**dims, split: stop - start}
        sub_inputs = {}
        for d in w.inputs:
            arr = inputs[d.name]
            if split in d.shape:
                index = [slice(None)] * len(d.shape)
                index[d.shape.index(split)] = slice(start, stop)
                arr = np.asarray(arr)[tuple(index)]
            sub_inputs[d.name] = arr
        result = _evaluate(w, sub_inputs, sub_dims)
        for o in w.outputs:
            if split in o.shape:
                index = [slice(None)] * len(o.shape)
                index[o.shape.index(split)] = slice(start, stop)
                outputs[o.name][tuple(index)] = result[o.name]
            elif start == 0:  # independent of the split dim: every block computes the same
                outputs[o.name][...] = result[o.name]

    try:
        workers = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        workers = os.cpu_count() or 1
    starts = range(0, rows, rows_per_block)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(16, workers))) as pool:
        for f in [pool.submit(block, s) for s in starts]:
            f.result()  # re-raises a SpecError from any block
    return outputs


def _evaluate(w: Workload, inputs, dims) -> dict[str, np.ndarray]:
    roots = [o.expr for o in w.outputs]
    order: list[Node] = []
    seen: set[Node] = set()
    for r in roots:
        for n in walk(r):
            if n not in seen:
                seen.add(n)
                order.append(n)
    uses: dict[Node, int] = {n: 0 for n in order}
    for n in order:
        for c in children(n):
            uses[c] += 1
    for r in roots:
        uses[r] += 1  # outputs are never freed or overwritten
    decls = {d.name: d for d in w.inputs}

    values: dict[Node, np.ndarray] = {}
    owned: set[Node] = set()  # buffers this function allocated (may be written in place)

    with np.errstate(all="ignore"):
        for n in order:
            ops = children(n)
            reusable = None
            for c in ops:
                if (
                    c in owned
                    and uses[c] == ops.count(c)
                    and values[c].shape == _shape_of(n, values, dims)
                    and values[c].dtype == np.float64
                ):
                    reusable = values[c]
                    break
            values[n] = np.asarray(_eval(n, values, decls, inputs, dims, reusable))
            if isinstance(n, Transpose):  # a view: neither it nor its operand is written in place
                owned.discard(n.x)
            else:
                owned.add(n)
            for c in ops:
                uses[c] -= 1
                if uses[c] == 0:
                    del values[c]
                    owned.discard(c)

    result = {}
    for o in w.outputs:
        v = values[o.expr]
        shape = concrete_shape(o.shape, dims)
        if v.shape != shape or any(v is r for r in result.values()):
            v = np.array(np.broadcast_to(v, shape), dtype=np.float64)
        result[o.name] = v
    return result


def _shape_of(n: Node, values, dims) -> tuple[int, ...]:
    if isinstance(n, Const):
        return ()
    return concrete_shape(n.shape, dims)


def _eval(n: Node, values, decls, inputs, dims, out) -> np.ndarray:
    if isinstance(n, Input):
        arr = inputs[n.name]
        if n.dtype in FLOAT_DTYPES:
            return to_float64(arr, n.dtype)
        if np.asarray(arr).dtype.kind not in "iu":
            raise SpecError([(f"inputs.{n.name}", f"must hold integers ({n.dtype})")])
        return np.asarray(arr).astype(np.int64)
    if isinstance(n, Const):
        return np.array(n.value, dtype=np.float64)
    if isinstance(n, Unary):
        x = _as_float(values[n.x])
        return _UNARY[n.op](x, out)
    if isinstance(n, Binary):
        a, b = _as_float(values[n.a]), _as_float(values[n.b])
        return _BINARY[n.op](a, b, out)
    if isinstance(n, Compare):
        return _COMPARE[n.op](_as_float(values[n.a]), _as_float(values[n.b]))
    if isinstance(n, Where):
        r = np.where(values[n.cond], _as_float(values[n.a]), _as_float(values[n.b]))
        return r.astype(np.float64, copy=False)
    if isinstance(n, Reduce):
        x = _as_float(values[n.x])
        fn = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}[n.op]
        return np.asarray(fn(x, axis=n.axis, keepdims=n.keepdims), dtype=np.float64)
    if isinstance(n, Scan):
        return _scan(n, _as_float(values[n.x]))
    if isinstance(n, Pool):
        return _pool(n, _as_float(values[n.x]))
    if isinstance(n, ArgReduce):
        x = _as_float(values[n.x])
        fn = np.argmax if n.op == "argmax" else np.argmin  # the first index on ties, as numpy
        return np.asarray(fn(x, axis=n.axis, keepdims=n.keepdims), dtype=np.int64)
    if isinstance(n, Gather):
        x, idx = values[n.x], values[n.idx]
        size = x.shape[-1]
        if idx.size and (idx.min() < 0 or idx.max() >= size):
            raise SpecError([(f"inputs.{n.idx.name}", f"has indices outside [0, {size})")])
        if idx.ndim == x.ndim:
            return np.take_along_axis(x, idx, axis=-1).astype(np.float64, copy=False)
        return np.take_along_axis(x, idx[..., None], axis=-1)[..., 0].astype(np.float64)
    if isinstance(n, Cast):
        return _round_through(_as_float(values[n.x]), n.to)
    if isinstance(n, Transpose):
        return np.swapaxes(_as_float(values[n.x]), -1, -2)
    if isinstance(n, MatMul):
        # float64 products summed in float64 (numpy's BLAS dgemm), batch axes broadcast
        return np.matmul(_as_float(values[n.a]), _as_float(values[n.b]))
    if isinstance(n, Attention):
        from factory.spec.attention import attention_reference

        extra = {x.name: _as_float(values[x]) for x in n.extra}
        try:
            return attention_reference(
                n, _as_float(values[n.q]), _as_float(values[n.k]), _as_float(values[n.v]), extra
            )
        except (ValueError, IndexError) as e:
            raise SpecError([("shapes", f"attention: {e}")]) from None
    raise SpecError([("expr", f"unknown node {type(n).__name__}")])


def apply_elementwise(n: Node, args: list) -> np.ndarray:
    """The value of an elementwise node (Unary, Binary, Compare, Where, Cast) from its operands'
    values, in float64 (booleans for a comparison): the same tables `_eval` uses."""
    if isinstance(n, Unary):
        return _UNARY[n.op](_as_float(args[0]), None)
    if isinstance(n, Binary):
        return _BINARY[n.op](_as_float(args[0]), _as_float(args[1]), None)
    if isinstance(n, Compare):
        return _COMPARE[n.op](_as_float(args[0]), _as_float(args[1]))
    if isinstance(n, Where):
        return np.where(args[0], _as_float(args[1]), _as_float(args[2])).astype(np.float64)
    if isinstance(n, Cast):
        return _round_through(_as_float(args[0]), n.to)
    raise SpecError([("expr", f"{type(n).__name__} is not elementwise")])


def _sigmoid(x, out):
    if out is None:
        out = np.empty(np.shape(x))  # ufuncs on 0-d input return scalars, not arrays
    r = np.negative(x, out=out)
    np.exp(r, out=r)
    r += 1.0
    return np.reciprocal(r, out=r)


def _rsqrt(x, out):
    if out is None:
        out = np.empty(np.shape(x))
    r = np.sqrt(x, out=out)
    return np.reciprocal(r, out=r)


def _erf(x, out):
    r = erf(x)
    if out is not None:
        out[...] = r
        return out
    return r


_UNARY = {
    "neg": lambda x, out: np.negative(x, out=out),
    "exp": lambda x, out: np.exp(x, out=out),
    "log": lambda x, out: np.log(x, out=out),
    "sqrt": lambda x, out: np.sqrt(x, out=out),
    "rsqrt": _rsqrt,
    "tanh": lambda x, out: np.tanh(x, out=out),
    "sigmoid": _sigmoid,
    "erf": _erf,
    "abs": lambda x, out: np.abs(x, out=out),
}


def _pow(a, b, out):
    e = float(b)
    if e == 2.0:
        return np.multiply(a, a, out=out)
    if e == 0.5:
        return np.sqrt(a, out=out)
    return np.power(a, e, out=out)


_BINARY = {
    "add": lambda a, b, out: np.add(a, b, out=out),
    "sub": lambda a, b, out: np.subtract(a, b, out=out),
    "mul": lambda a, b, out: np.multiply(a, b, out=out),
    "div": lambda a, b, out: np.divide(a, b, out=out),
    "max": lambda a, b, out: np.maximum(a, b, out=out),  # NaN propagates, as in PTX max.NaN
    "min": lambda a, b, out: np.minimum(a, b, out=out),
    "pow": _pow,
}

_COMPARE = {
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "eq": np.equal,
    "ne": np.not_equal,
}


def _scan(n: Scan, x: np.ndarray) -> np.ndarray:
    """cumsum/cumprod along n.axis in float64; reverse runs from the end, exclusive shifts by one
    and starts from the identity (0 or 1)."""
    fn = np.cumsum if n.op == "sum" else np.cumprod
    if n.reverse:
        x = np.flip(x, axis=n.axis)
    r = fn(x, axis=n.axis, dtype=np.float64)
    if n.exclusive:
        shifted = np.empty_like(r)
        head = [slice(None)] * r.ndim
        rest = [slice(None)] * r.ndim
        body = [slice(None)] * r.ndim
        head[n.axis], rest[n.axis], body[n.axis] = slice(0, 1), slice(1, None), slice(0, -1)
        shifted[tuple(head)] = 0.0 if n.op == "sum" else 1.0
        shifted[tuple(rest)] = r[tuple(body)]
        r = shifted
    if n.reverse:
        r = np.flip(r, axis=n.axis)
    return np.ascontiguousarray(r)


def _pool(n: Pool, x: np.ndarray) -> np.ndarray:
    """maxpool/avgpool over the trailing len(n.window) axes: padded with -inf (max) or zeros
    (avg, counted: torch's count_include_pad), windows every stride."""
    nd = len(n.window)
    lead = x.ndim - nd
    pad = [(0, 0)] * lead + [(p, p) for p in n.padding]
    xp = np.pad(x, pad, constant_values=-np.inf if n.op == "max" else 0.0)
    axes = tuple(range(lead, x.ndim))
    win = np.lib.stride_tricks.sliding_window_view(xp, n.window, axis=axes)
    win = win[(slice(None),) * lead + tuple(slice(None, None, s) for s in n.stride)]
    red = tuple(range(x.ndim, x.ndim + nd))
    r = win.max(axis=red) if n.op == "max" else win.mean(axis=red)
    return np.ascontiguousarray(r, dtype=np.float64)
