"""The attention operator of the expression language, and its float64 reference.

In a manifest an output is

    attention(q, k, v, score="30 * tanh(s / 30)", mask=["j <= i", "i - j < 1024"], scale=0.1)
    attention_lse(q, k, v, ...)            # the same keywords: the log-sum-exp per query row

q is (B, Hq, S, D), k and v (B, Hkv, Skv, D), with Hq a multiple of Hkv (grouped query heads:
query head h reads key/value head h // (Hq / Hkv)). `scale` defaults to 1 / sqrt(D). The score
of query i and key j is the `score` expression over

    s   the scaled dot product scale * q[b, h, i] . k[b, h // g, j]
    i   the query index, j the key index, h the query head (numbers, 0-based)
    x[h], x[i], x[j]   an input per head ((Hq,) or (B, Hq)) or per position ((S,)/(B, S) for i,
                       (Skv,)/(B, Skv) for j), read at that index (e.g. slope[h], doc[j])

plus the manifest's constants and lets. `mask` is one comparison or a list of them, all of
which must hold for key j to count (causal "j <= i", a window "i - j < 1024", a document mask
"doc[i] == doc[j]"). Both are parsed by the expression parser (factory.spec.parse), never
evaluated as Python. A row whose every key is masked out is zero, its log-sum-exp -inf.

The reference evaluates in float64 in blocks of queries, so a long sequence needs memory for
one block of scores at a time (per thread; see "the float64 reference" below).
"""

from __future__ import annotations

import ast
import dataclasses
import math
import threading

import numpy as np

from factory.spec.expr import Attention, Compare, Const, Gather, Input, Node, walk

ATTENTION_FUNCS = ("attention", "attention_lse")
KEYWORDS = ("score", "mask", "scale")
MAX_MASK_TERMS = 8
QUERY_BLOCK = 256  # query rows per reference block: a (256, Skv) float64 score matrix
STACK_ELEMENTS = 1 << 22  # query heads stacked in one product: at most 32 MiB of scores

# The placeholders a score or mask expression reads; inside one they shadow manifest names.
S = Input("s", (), "fp32")
I = Input("i", (), "int32")  # noqa: E741 - the query index is i in every text on attention
J = Input("j", (), "int32")
H = Input("h", (), "int32")
PLACEHOLDERS = {"s": S, "i": I, "j": J, "h": H}


def _error(message: str):
    from factory.spec.parse import ExprError

    return ExprError(message)


def _text_keyword(v: ast.AST, what: str) -> str:
    if isinstance(v, ast.Constant) and isinstance(v.value, str):
        return v.value
    raise _error(f"attention(): {what} must be a quoted expression, e.g. {what}='j <= i'")


def parse_call(parser, fname: str, n: ast.Call, keywords: dict, depth: int) -> Node:
    """The Attention node of `attention(q, k, v, ...)` / `attention_lse(...)` as `parser` (an
    ExprParser) sees it. Raises ExprError naming what is wrong."""
    for k in keywords:
        if k not in KEYWORDS:
            raise _error(f"{fname}() got an unexpected keyword {k!r}"[:120])
    if len(n.args) != 3:
        raise _error(f"{fname}() takes 3 arguments (q, k, v) and keywords score, mask, scale")
    q, k, v = (parser._visit(a, depth + 1) for a in n.args)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Input) or t.dtype not in ("bf16", "fp16", "fp32"):
            raise _error(f"{fname}(): {name} must be a floating-point input tensor")
        if len(t.shape) != 4:
            raise _error(f"{fname}(): {name} must have 4 axes (B, heads, sequence, head dim)")
    if k.shape != v.shape:
        raise _error(f"{fname}(): k and v must have the same shape")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise _error(f"{fname}(): q and k must share the batch (first) and head dim (last) axes")
    scale = None
    if "scale" in keywords:
        sv = keywords["scale"]
        if isinstance(sv, ast.UnaryOp) and isinstance(sv.op, ast.USub):
            raise _error(f"{fname}(): scale must be a positive number")
        if not (isinstance(sv, ast.Constant) and type(sv.value) in (int, float)):
            raise _error(f"{fname}(): scale must be a number")
        scale = float(sv.value)
        if not (math.isfinite(scale) and 0 < scale < 1e6):
            raise _error(f"{fname}(): scale must be a positive finite number")
    if scale is None:
        d = q.shape[3]
        if not isinstance(d, int):
            # the head dim is a symbol: 1/sqrt(D) would differ per shape; say it instead
            raise _error(f"{fname}(): give scale= when the head dim is a named dim")
        scale = 1.0 / math.sqrt(d)
    sub = _ScoreParser(parser, q, k)
    score = None
    if "score" in keywords:
        score = sub.parse_term(_text_keyword(keywords["score"], "score"), "score")
        if isinstance(score, Compare):
            raise _error(f"{fname}(): score must be a number, not a comparison (use mask=)")
    mask: list[Node] = []
    if "mask" in keywords:
        mv = keywords["mask"]
        items = mv.elts if isinstance(mv, ast.List | ast.Tuple) else [mv]
        if len(items) > MAX_MASK_TERMS:
            raise _error(f"{fname}(): at most {MAX_MASK_TERMS} mask terms")
        for item in items:
            term = sub.parse_term(_text_keyword(item, "mask"), "mask")
            if not isinstance(term, Compare):
                raise _error(f"{fname}(): each mask term must be a comparison such as 'j <= i'")
            mask.append(term)
    extra = tuple(dict.fromkeys(sub.extra))
    b, hq, sq, d = q.shape
    shape = (b, hq, sq, d) if fname == "attention" else (b, hq, sq)
    node = Attention(
        q,
        k,
        v,
        extra,
        score,
        tuple(mask),
        scale,
        "out" if fname == "attention" else "lse",
        shape,
    )
    return parser.make(node)


class _ScoreParser:
    """Parses a score or mask text with the manifest's scope plus the placeholders, and
    subscripts x[i] / x[j] / x[h] of per-position or per-head inputs."""

    def __init__(self, parser, q: Input, k: Input):
        from factory.spec.parse import ExprParser

        self.q, self.k = q, k
        self.extra: list[Input] = []
        outer = self

        class _Parser(ExprParser):
            def _visit(self, n, depth):
                if isinstance(n, ast.Subscript):
                    return outer._subscript(self, n)
                return super()._visit(n, depth)

        scope = {**parser.scope, **PLACEHOLDERS}
        self.parser = _Parser(scope, parser.interner)

    def parse_term(self, text: str, what: str) -> Node:
        try:
            node = self.parser.parse(text)
        except Exception as e:  # ExprError: say which keyword it came from
            raise _error(f"attention() {what}: {e}") from None
        read = {g.x for g in walk(node) if isinstance(g, Gather)}
        for n in walk(node):
            if n in read:
                continue  # a tensor read by subscript
            if n.shape != ():
                raise _error(
                    f"attention() {what}: every value must be one number per (i, j); "
                    f"read a tensor by subscript, e.g. slope[h] or doc[j]"
                )
            if isinstance(n, Input) and n not in PLACEHOLDERS.values() and n not in self.extra:
                raise _error(f"attention() {what}: {n.name} must be read by subscript")
        return node

    def _subscript(self, parser, n: ast.Subscript) -> Node:
        if not isinstance(n.value, ast.Name) or not isinstance(n.slice, ast.Name):
            raise _error("a subscript must be name[i], name[j] or name[h]")
        idx_name = n.slice.id
        if idx_name not in ("i", "j", "h"):
            raise _error("a subscript's index must be i, j or h")
        x = parser.scope.get(n.value.id)
        if not isinstance(x, Input) or n.value.id in PLACEHOLDERS:
            raise _error(f"{n.value.id!r} is not an input tensor that can be subscripted"[:120])
        b, hq, sq, _ = self.q.shape
        axis = {"i": sq, "j": self.k.shape[2], "h": hq}[idx_name]
        if x.shape not in ((axis,), (b, axis)):
            raise _error(
                f"{x.name}[{idx_name}]: {x.name} must have shape ({axis},) or ({b}, {axis}), "
                f"not {x.shape}"
            )
        self.extra.append(x)
        return parser.make(Gather(x, PLACEHOLDERS[idx_name], ()))


# -- the float64 reference -----------------------------------------------------------------------
#
# Work is cut into query blocks of QUERY_BLOCK rows. Per block, the mask terms that read only i
# and j (and per-position inputs without a batch axis) are evaluated once and shared by every
# batch entry and head; the keys no row of the block keeps (the future of a causal block, what
# lies outside a window) are never multiplied: the block's products run over the span of keys
# from the first kept one to the last. Query heads that share a key/value head are stacked into
# one product (fewer, bigger float64 GEMMs), and the softmax runs in place on the score block.
# Query blocks run on PTXF_REFERENCE_THREADS threads (default 1): the GPU worker's helper
# processes set it with their BLAS capped at one thread each, so products and score math both
# use the cores without nested thread pools. The result does not depend on the thread count.

THREADS_ENV = "PTXF_REFERENCE_THREADS"


def reference_threads() -> int:
    """Threads the reference runs query blocks on: PTXF_REFERENCE_THREADS (1 to 64), else 1."""
    import os

    try:
        n = int(os.environ.get(THREADS_ENV, "1"))
    except ValueError:
        return 1
    return max(1, min(64, n))


def _eval_term(node: Node, env: dict, extra: dict, b: int, cache: dict) -> np.ndarray:
    """node over the broadcast index arrays in env (s, i, j, h), float64 or bool."""
    from factory.spec.reference import apply_elementwise

    if node in cache:
        return cache[node]
    if isinstance(node, Input):
        r = env[node.name]
    elif isinstance(node, Const):
        r = np.float64(node.value)
    elif isinstance(node, Gather):
        arr = extra[node.x.name]
        if arr.ndim == 2:
            arr = arr[b]
        r = arr[np.asarray(env[node.idx.name], dtype=np.int64)]
    else:
        args = [_eval_term(c, env, extra, b, cache) for c in _operands(node)]
        r = apply_elementwise(node, args)
    cache[node] = r
    return r


def _operands(node: Node) -> tuple[Node, ...]:
    from factory.spec.expr import children

    return children(node)


_BOTH: dict = {}  # id key -> (q, k, v, node, the other part): the two parts share one pass
_BOTH_LOCK = threading.Lock()


def attention_reference(
    node: Attention, q: np.ndarray, k: np.ndarray, v: np.ndarray, extra: dict[str, np.ndarray]
) -> np.ndarray:
    """node's result in float64 from float64 q, k, v and the extra inputs (by name); the other
    part (out or lse) of the same call is kept for the next request with these very arrays.
    Raises ValueError when Hq is not a multiple of Hkv."""
    other = dataclasses.replace(node, part="lse" if node.part == "out" else "out", shape=())
    with _BOTH_LOCK:
        hit = _BOTH.pop((id(q), id(k), id(v), hash(other)), None)
    if hit is not None and hit[0] is q and hit[1] is k and hit[2] is v and hit[3] == other:
        return hit[4]
    out, lse = _attention_both(node, q, k, v, extra)
    mine, theirs = (out, lse) if node.part == "out" else (lse, out)
    me = dataclasses.replace(node, shape=())
    with _BOTH_LOCK:
        if len(_BOTH) > 8:
            _BOTH.clear()
        _BOTH[(id(q), id(k), id(v), hash(me))] = (q, k, v, me, theirs)
    return mine


def _reads(node: Node) -> tuple[set[str], bool]:
    """(the placeholders node reads, whether it reads an input with a batch axis)."""
    nodes = walk(node)
    names = {n.name for n in nodes if isinstance(n, Input) and n == PLACEHOLDERS.get(n.name)}
    per_batch = any(isinstance(n, Gather) and len(n.x.shape) == 2 for n in nodes)
    return names, per_batch


def _attention_both(node, q, k, v, extra) -> tuple[np.ndarray, np.ndarray]:
    """(out, lse) of the attention `node` describes, in blocks of queries."""
    bsz, hq, sq, d = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    if hq % hkv:
        raise ValueError(f"{hq} query heads are not a multiple of {hkv} key/value heads")
    group = hq // hkv
    out = np.empty((bsz, hq, sq, d))
    lse_all = np.empty((bsz, hq, sq))
    shared, per_head, late = [], [], []  # mask terms: once a block / per (b, heads) / after s
    for term in node.mask:
        names, per_batch = _reads(term)
        if "s" in names:
            late.append(term)
        elif "h" in names or per_batch:
            per_head.append(term)
        else:
            shared.append(term)
    # work items of a block: (b, kv head, first query head, end): a kv head's query heads are
    # stacked into one product up to STACK_ELEMENTS scores (fixed by the shapes alone, so the
    # result is the same on any number of threads)
    step = max(1, min(group, STACK_ELEMENTS // max(1, QUERY_BLOCK * skv)))
    items = [
        (b, kvh, h0, min(h0 + step, (kvh + 1) * group))
        for b in range(bsz)
        for kvh in range(hkv)
        for h0 in range(kvh * group, (kvh + 1) * group, step)
    ]
    j_all = np.arange(skv, dtype=np.float64)[None, :]
    local = threading.local()  # each thread's score workspace, made once

    def one_block(i0: int) -> None:
        i1 = min(sq, i0 + QUERY_BLOCK)
        i_col = np.arange(i0, i1, dtype=np.float64)[:, None]
        keep = None  # the shared terms over (rows, all keys); None: every key kept
        for term in shared:
            t = np.broadcast_to(
                _eval_term(term, {"i": i_col, "j": j_all}, extra, 0, {}), (i1 - i0, skv)
            )
            keep = t.copy() if keep is None else keep & t
        block = (i0, i1, i_col, None if keep is None else ~keep)
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = np.empty(step * QUERY_BLOCK * skv)
        for item in items:
            _block(node, q, k, v, extra, block, item, per_head, late, out, lse_all, buf)

    starts = range(0, sq, QUERY_BLOCK)
    threads = min(reference_threads(), len(starts))
    if threads <= 1:
        for i0 in starts:
            one_block(i0)
        return out, lse_all
    from concurrent.futures import ThreadPoolExecutor

    errstate = np.geterr()  # worker threads start from numpy's defaults: use the caller's

    def run(i0: int) -> None:
        with np.errstate(**errstate):
            one_block(i0)

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(run, starts))
    return out, lse_all


def _key_span(drop: np.ndarray | None, skv: int) -> tuple[int, int]:
    """[lo, hi): from the first key some row keeps (drop False) to the last; (0, 0) when no row
    keeps any."""
    if drop is None:
        return 0, skv
    cols = ~drop.reshape(-1, skv).all(axis=0)
    if not cols.any():
        return 0, 0
    return int(np.argmax(cols)), skv - int(np.argmax(cols[::-1]))


def _eval_in_place(roots: list[Node], env: dict, extra: dict, b: int) -> list:
    """The values of roots (the score, the mask terms that read s) over env, like `_eval_term`,
    but an elementwise node writes its result into an operand's array when that operand is a
    float64 array of the result's shape that this evaluation made (or s, the block's workspace)
    and nothing else reads it: 30 * tanh(s / 30) runs in s's own memory."""
    from factory.spec.expr import Binary, Unary
    from factory.spec.reference import _BINARY, _UNARY, _as_float, apply_elementwise

    order: list[Node] = []
    seen: set[Node] = set()
    for r in roots:
        for n in walk(r):
            if n not in seen:
                seen.add(n)
                order.append(n)
    uses = dict.fromkeys(order, 0)
    for n in order:
        for c in _operands(n):
            uses[c] += 1
    for r in roots:
        uses[r] += 1  # results are never overwritten
    values: dict[Node, object] = {}
    owned: set[Node] = set()
    for n in order:
        ops = _operands(n)
        if isinstance(n, Input):
            r = env.get(n.name)  # None for a tensor only read through its Gather
            if n.name == "s":
                owned.add(n)
        elif isinstance(n, Const):
            r = np.float64(n.value)
        elif isinstance(n, Gather):
            r = _eval_term(n, env, extra, b, {})
            owned.add(n)
        else:
            args = [values[c] for c in ops]
            into = None
            if isinstance(n, Unary | Binary):
                shape = np.broadcast_shapes(*(np.shape(a) for a in args))
                for c, a in zip(ops, args, strict=True):
                    if c in owned and uses[c] == ops.count(c) and np.shape(a) == shape:
                        if a.dtype == np.float64:
                            into = a
                            break
            if into is None:
                r = apply_elementwise(n, args)
            elif isinstance(n, Unary):  # the same tables as apply_elementwise, with out=
                r = _UNARY[n.op](_as_float(args[0]), into)
            else:
                r = _BINARY[n.op](_as_float(args[0]), _as_float(args[1]), into)
            owned.add(n)
        values[n] = r
        for c in ops:
            uses[c] -= 1
            if uses[c] == 0:
                del values[c]
                owned.discard(c)
    return [values[r] for r in roots]


def _block(node, q, k, v, extra, block, item, per_head, late, out, lse_all, buf):
    """One query block of heads h0..h1 (sharing key/value head kvh) of batch entry b: writes
    their rows of out and lse_all. `buf` is the calling thread's workspace for the scores."""
    i0, i1, i_col, drop = block
    b, kvh, h0, h1 = item
    rows, gh, d = i1 - i0, h1 - h0, q.shape[3]
    skv = k.shape[2]
    h_col = np.arange(h0, h1, dtype=np.float64)[:, None, None]
    if per_head:
        env = {"i": i_col, "j": np.arange(skv, dtype=np.float64)[None, :], "h": h_col}
        cache: dict = {}
        keep = np.ones((gh, rows, skv), dtype=bool)
        if drop is not None:
            keep &= ~drop
        for term in per_head:
            keep &= np.broadcast_to(_eval_term(term, env, extra, b, cache), keep.shape)
        drop = ~keep
    lo, hi = _key_span(drop, skv)
    if hi == lo:  # no row of the block keeps a key
        out[b, h0:h1, i0:i1] = 0.0
        lse_all[b, h0:h1, i0:i1] = -np.inf
        return
    n = hi - lo
    if drop is not None:
        drop = drop[..., lo:hi]
        if not drop.any():
            drop = None
    qs = q[b, h0:h1, i0:i1].reshape(gh * rows, d)
    s2 = buf[: gh * rows * n].reshape(gh * rows, n)
    np.matmul(qs, k[b, kvh, lo:hi].T, out=s2)  # one float64 GEMM for the group's heads
    s2 *= node.scale
    s = s2.reshape(gh, rows, n)
    env = {"s": s, "i": i_col, "j": np.arange(lo, hi, dtype=np.float64)[None, :], "h": h_col}
    if node.score is None:
        work, late_values = s, _eval_in_place(late, env, extra, b)
    else:
        score, *late_values = _eval_in_place([node.score, *late], env, extra, b)
        if isinstance(score, np.ndarray) and score.dtype == np.float64 and score.shape == s.shape:
            work = score  # s itself or an array of its own
        else:  # a score that does not vary over every axis: spread into s, no longer read
            np.copyto(s, np.broadcast_to(score, s.shape))
            work = s
    for t in late_values:
        gone = ~np.broadcast_to(t, s.shape)
        drop = gone if drop is None else drop | gone
    if drop is not None:
        np.copyto(work, -np.inf, where=np.broadcast_to(drop, work.shape))
    m = work.max(axis=-1, keepdims=True)
    any_kept = np.isfinite(m)
    m_safe = np.where(any_kept, m, 0.0)
    work -= m_safe
    np.exp(work, out=work)  # exp(-inf) = 0 for masked keys
    total = work.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = np.where(any_kept, m_safe + np.log(total), -np.inf)
    lse_all[b, h0:h1, i0:i1] = lse[..., 0]
    o = (work.reshape(gh * rows, n) @ v[b, kvh, lo:hi]).reshape(gh, rows, d)
    o /= np.where(total > 0, total, 1.0)
    out[b, h0:h1, i0:i1] = np.where(any_kept, o, 0.0)


def naive_reference(
    node: Attention, q: np.ndarray, k: np.ndarray, v: np.ndarray, extra: dict[str, np.ndarray]
) -> np.ndarray:
    """The same result without blocks, grouping by repeat or the shared evaluator: the whole
    (B, Hq, S, Skv) score tensor at once, each element's score and mask by plain Python. For
    tests at small shapes only."""
    hq, hkv = q.shape[1], k.shape[1]
    kk = np.repeat(k, hq // hkv, axis=1)
    vv = np.repeat(v, hq // hkv, axis=1)
    s = np.einsum("bhid,bhjd->bhij", q, kk) * node.scale
    score = np.full(s.shape, -np.inf)
    for b, h, i, j in np.ndindex(*s.shape):
        env = {"s": s[b, h, i, j], "i": float(i), "j": float(j), "h": float(h)}
        if all(bool(_scalar(t, env, extra, b)) for t in node.mask):
            score[b, h, i, j] = (
                s[b, h, i, j] if node.score is None else _scalar(node.score, env, extra, b)
            )
    m = score.max(axis=-1, keepdims=True)
    p = np.exp(score - np.where(np.isfinite(m), m, 0.0))
    total = p.sum(axis=-1, keepdims=True)
    if node.part == "lse":
        with np.errstate(divide="ignore"):
            return np.where(np.isfinite(m), m + np.log(total), -np.inf)[..., 0]
    o = np.einsum("bhij,bhjd->bhid", p, vv) / np.where(total > 0, total, 1.0)
    return np.where(np.isfinite(m), o, 0.0)


def _scalar(node: Node, env: dict, extra: dict, b: int) -> float:
    """node at one (i, j) by plain Python arithmetic (independent of the numpy evaluator)."""
    from factory.spec.expr import Binary, Unary, Where

    if isinstance(node, Input):
        return env[node.name]
    if isinstance(node, Const):
        return node.value
    if isinstance(node, Gather):
        arr = extra[node.x.name]
        if arr.ndim == 2:
            arr = arr[b]
        return float(arr[int(env[node.idx.name])])
    if isinstance(node, Unary):
        x = _scalar(node.x, env, extra, b)
        return {
            "neg": lambda: -x,
            "exp": lambda: math.exp(x),
            "log": lambda: math.log(x),
            "sqrt": lambda: math.sqrt(x),
            "rsqrt": lambda: 1 / math.sqrt(x),
            "tanh": lambda: math.tanh(x),
            "sigmoid": lambda: 1 / (1 + math.exp(-x)),
            "erf": lambda: math.erf(x),
            "abs": lambda: abs(x),
        }[node.op]()
    if isinstance(node, Binary):
        a, c = _scalar(node.a, env, extra, b), _scalar(node.b, env, extra, b)
        return {
            "add": a + c,
            "sub": a - c,
            "mul": a * c,
            "div": a / c if c else math.copysign(math.inf, a),
            "max": max(a, c),
            "min": min(a, c),
            "pow": a**c if node.op == "pow" else 0.0,
        }[node.op]
    if isinstance(node, Where):
        if _scalar(node.cond, env, extra, b):
            return _scalar(node.a, env, extra, b)
        return _scalar(node.b, env, extra, b)
    if isinstance(node, Compare):
        a, c = _scalar(node.a, env, extra, b), _scalar(node.b, env, extra, b)
        return {"lt": a < c, "le": a <= c, "gt": a > c, "ge": a >= c, "eq": a == c, "ne": a != c}[
            node.op
        ]
    raise ValueError(f"{type(node).__name__} in a score or mask")
