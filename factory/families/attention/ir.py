"""AttentionIR: what the attention emitter consumes, the lowering of a workload onto it, and the
analysis of its mask into key bands that decide which KV tiles a query tile skips.

A workload lowers when its outputs are one `attention(q, k, v, ...)` (bf16 or fp16) and at most
one `attention_lse(...)` of the same arguments (fp32), q/k/v bf16 (or all fp16), head dim 64 or
128 (a literal in the shapes), and the score and mask read only s, i, j, h, constants and
subscripted per-head / per-position inputs (factory.spec.attention).

Mask bands: a mask term that is linear in j - i alone (`j <= i`, `i - j < 1024`, `j - i >= -5`)
bounds the keys of query i to [i + lo, i + hi]. The intersection of every such term is the
band; a KV tile wholly outside the band of every row of a query tile is never loaded, one wholly
inside it needs no element masking, and the rest (the diagonal tiles) are masked element by
element. Any other term is evaluated on every element of every tile the band keeps. An id
match `x[i] == x[j]` (a document mask) also narrows a query tile's KV tiles to those holding a
key whose id lies within the tile's own ids' [min, max] (`id_matches`; see tiling.id_tiles).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from factory.families.base import Unsupported
from factory.spec import expr as E
from factory.spec.attention import PLACEHOLDERS

HEAD_DIMS = (64, 128)
INPUT_DTYPES = ("bf16", "fp16")
OUT_DTYPES = ("bf16", "fp16")


@dataclass(frozen=True)
class ExtraInput:
    """A per-head or per-position input the score or mask reads, at the `indices` among "h",
    "i", "j" (a document id per key position is read at i and at j); `batched` when it has a
    leading batch axis ((B, n) rather than (n,))."""

    name: str
    dtype: str
    indices: tuple[str, ...]
    batched: bool


@dataclass(frozen=True)
class AttentionIR:
    name: str  # kernel name stem
    q: str
    k: str
    v: str
    dtype: str  # of q, k, v
    b: str | int  # dims: batch, query heads, kv heads, query length, key length
    hq: str | int
    hkv: str | int
    s: str | int
    skv: str | int
    head_dim: int
    scale: float
    score: E.Node | None  # over the placeholders s, i, j, h (None: s)
    mask: tuple[E.Node, ...]  # every comparison (band terms included)
    band_lo: int | None  # keys j >= i + band_lo (None: no lower bound)
    band_hi: int | None  # keys j <= i + band_hi
    elementwise: tuple[E.Node, ...]  # mask terms that are not bands
    extra: tuple[ExtraInput, ...]
    out: str
    out_dtype: str
    lse: str | None  # the log-sum-exp output's name (fp32), or None
    id_matches: tuple[str, ...] = ()  # inputs x with a mask term x[i] == x[j]

    @property
    def causal_like(self) -> bool:
        return self.band_hi is not None


def _linear(n: E.Node) -> tuple[float, float, float] | None:
    """(ci, cj, c0) with n = ci * i + cj * j + c0 when n is linear in the placeholders i and j
    alone (constants folded), else None."""
    if isinstance(n, E.Const):
        return (0.0, 0.0, n.value)
    if n is PLACEHOLDERS["i"] or n == PLACEHOLDERS["i"]:
        return (1.0, 0.0, 0.0)
    if n is PLACEHOLDERS["j"] or n == PLACEHOLDERS["j"]:
        return (0.0, 1.0, 0.0)
    if isinstance(n, E.Unary) and n.op == "neg":
        x = _linear(n.x)
        return None if x is None else (-x[0], -x[1], -x[2])
    if isinstance(n, E.Binary) and n.op in ("add", "sub", "mul"):
        a, b = _linear(n.a), _linear(n.b)
        if a is None or b is None:
            return None
        if n.op == "add":
            return (a[0] + b[0], a[1] + b[1], a[2] + b[2])
        if n.op == "sub":
            return (a[0] - b[0], a[1] - b[1], a[2] - b[2])
        if a[0] == a[1] == 0:  # constant * linear
            return (a[2] * b[0], a[2] * b[1], a[2] * b[2])
        if b[0] == b[1] == 0:
            return (b[2] * a[0], b[2] * a[1], b[2] * a[2])
    return None


def band_of(term: E.Node) -> tuple[int | None, int | None] | None:
    """(lo, hi) with the term true exactly when lo <= j - i <= hi (None: unbounded), for a
    comparison linear in j - i alone; None for any other term."""
    if not isinstance(term, E.Compare) or term.op == "ne":
        return None
    a, b = _linear(term.a), _linear(term.b)
    if a is None or b is None:
        return None
    ci, cj, c0 = a[0] - b[0], a[1] - b[1], a[2] - b[2]  # ci i + cj j + c0  op  0
    if cj == 0 or ci != -cj:
        return None
    # cj (j - i) + c0 op 0  ->  d op' t with d = j - i
    t = -c0 / cj
    op = term.op
    if cj < 0:
        op = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq"}[op]
    if op == "le":
        return (None, math.floor(t))
    if op == "lt":
        return (None, math.ceil(t) - 1)
    if op == "ge":
        return (math.ceil(t), None)
    if op == "gt":
        return (math.floor(t) + 1, None)
    if t != int(t):
        return (1, 0)  # never true: an empty band
    return (int(t), int(t))


def id_match_of(term: E.Node) -> str | None:
    """The input's name when `term` is x[i] == x[j] (either side first), else None."""
    if not isinstance(term, E.Compare) or term.op != "eq":
        return None
    a, b = term.a, term.b
    if not (isinstance(a, E.Gather) and isinstance(b, E.Gather)):
        return None
    if not (isinstance(a.x, E.Input) and isinstance(b.x, E.Input)) or a.x.name != b.x.name:
        return None
    if {getattr(a.idx, "name", None), getattr(b.idx, "name", None)} != {"i", "j"}:
        return None
    return a.x.name


def lower(workload) -> AttentionIR:
    """The AttentionIR of `workload`; Unsupported naming the construct otherwise."""
    outs = list(workload.outputs)
    nodes = [o.expr for o in outs]
    if not nodes or not all(isinstance(n, E.Attention) for n in nodes):
        raise Unsupported("not an attention: every output must be attention(...) or its lse")
    main = [o for o in outs if o.expr.part == "out"]
    lse = [o for o in outs if o.expr.part == "lse"]
    if len(main) != 1 or len(lse) > 1:
        raise Unsupported("one attention output and at most one attention_lse output")
    o = main[0]
    node: E.Attention = o.expr
    if lse:
        other = lse[0].expr
        same = (other.q, other.k, other.v, other.score, other.mask, other.scale)
        if same != (node.q, node.k, node.v, node.score, node.mask, node.scale):
            raise Unsupported("attention_lse must take the same arguments as attention")
        if lse[0].dtype != "fp32":
            raise Unsupported("the log-sum-exp output is stored as fp32")
    q, k, v = node.q, node.k, node.v
    if not q.dtype == k.dtype == v.dtype or q.dtype not in INPUT_DTYPES:
        raise Unsupported(f"q, k and v must all be one of {', '.join(INPUT_DTYPES)}")
    if o.dtype not in OUT_DTYPES:
        raise Unsupported(f"the attention output is stored as one of {', '.join(OUT_DTYPES)}")
    d = q.shape[3]
    if d not in HEAD_DIMS:
        raise Unsupported(f"head dim {d}: the emitter renders {HEAD_DIMS} (a literal size)")
    lo = hi = None
    elementwise = []
    for term in node.mask:
        band = band_of(term)
        if band is None:
            elementwise.append(term)
            continue
        tlo, thi = band
        if tlo is not None:
            lo = tlo if lo is None else max(lo, tlo)
        if thi is not None:
            hi = thi if hi is None else min(hi, thi)
    extra = []
    for x in node.extra:
        if x.dtype not in ("fp32", "bf16", "fp16", "int32"):
            raise Unsupported(f"{x.name}: per-head/position inputs are fp32, bf16, fp16 or int32")
    reads = {}
    for t in ([node.score] if node.score is not None else []) + list(node.mask):
        for n in E.walk(t):
            if isinstance(n, E.Gather):
                reads.setdefault(n.x.name, set()).add(n.idx.name)
            if isinstance(n, E.Reduce | E.MatMul | E.Scan | E.ArgReduce | E.Pool):
                raise Unsupported(f"{type(n).__name__} in a score or mask")
    for x in node.extra:
        idx = tuple(sorted(reads.get(x.name, set())))
        extra.append(ExtraInput(x.name, x.dtype, idx, len(x.shape) == 2))
    stem = "".join(c if c.isalnum() else "_" for c in workload.name)[:40] or "attention"
    return AttentionIR(
        name=f"attn_{stem}",
        q=q.name,
        k=k.name,
        v=v.name,
        dtype=q.dtype,
        b=q.shape[0],
        hq=q.shape[1],
        hkv=k.shape[1],
        s=q.shape[2],
        skv=k.shape[2],
        head_dim=int(d),
        scale=node.scale,
        score=node.score,
        mask=tuple(node.mask),
        band_lo=lo,
        band_hi=hi,
        elementwise=tuple(elementwise),
        extra=tuple(extra),
        out=o.name,
        out_dtype=o.dtype,
        lse=lse[0].name if lse else None,
        id_matches=tuple(dict.fromkeys(n for t in elementwise if (n := id_match_of(t)))),
    )


def dim_value(d: str | int, dims: dict) -> int:
    return int(dims[d]) if isinstance(d, str) else int(d)


def linear_in_s(node: E.Node) -> float | None:
    """k where `node` is k * s (s, -s, s * c, c * s, s / c), else None."""
    if isinstance(node, E.Input) and node.name == "s":
        return 1.0
    if isinstance(node, E.Unary) and node.op == "neg":
        k = linear_in_s(node.x)
        return None if k is None else -k
    if isinstance(node, E.Binary) and node.op in ("mul", "div"):
        a, c = node.a, node.b
        if node.op == "mul" and isinstance(a, E.Const):
            a, c = c, a
        if isinstance(c, E.Const) and c.value != 0:
            k = linear_in_s(a)
            if k is not None:
                return k * c.value if node.op == "mul" else k / c.value
    return None


def _reads_ijs(node: E.Node) -> bool:
    return any(
        isinstance(n, E.Input)
        and n.name in ("s", "i", "j")
        or isinstance(n, E.Gather)
        and getattr(n.idx, "name", None) in ("i", "j")
        for n in E.walk(node)
    )


def alibi_of(score: E.Node | None) -> tuple[float, E.Node] | None:
    """(k, coef) when `score` is k * s - coef * abs(i - j) (abs(j - i), the product either way
    round), coef reading neither s, i nor j (slope[h], a constant): an ALiBi bias, linear in j
    on either side of the diagonal, which the kernel builds from one value a row per tile
    (emit.softmax's `side`). None for any other score."""
    if not (isinstance(score, E.Binary) and score.op == "sub"):
        return None
    k = linear_in_s(score.a)
    prod = score.b
    if k is None or not (isinstance(prod, E.Binary) and prod.op == "mul"):
        return None
    for coef, ab in ((prod.a, prod.b), (prod.b, prod.a)):
        if not (isinstance(ab, E.Unary) and ab.op == "abs"):
            continue
        lin = _linear(ab.x)
        if lin is None or lin[2] != 0 or {lin[0], lin[1]} != {1.0, -1.0}:
            continue
        if not _reads_ijs(coef):
            return k, coef
    return None
