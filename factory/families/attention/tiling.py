"""The attention kernel's tile arithmetic in plain Python, and a numpy model of its loop.

The emitter writes these same formulas in PTX: which KV tiles a query tile visits (the band of
the mask, clipped to the keys), which of them are masked element by element, the order of the
query tiles (longest first). `simulate` runs the kernel's algorithm in numpy (fp32 scores,
online softmax in base 2, P rounded to bf16, the visited tiles only, masks as the kernel applies
them) so that a slip in the skip logic shows against the float64 reference without a GPU.
"""

from __future__ import annotations

import math

import numpy as np

LOG2E = 1.4426950408889634
# rows of one warp in a consumer warpgroup's S fragment (64 rows, 4 warps): the unit of the
# kernel's per-tile branches on the band and ALiBi's side (warp-uniform)
WARP_ROWS = 16


def ceildiv(a: int, b: int) -> int:
    return -(-a // b)


def kv_tiles(i0: int, rows: int, skv: int, bn: int, lo: int | None, hi: int | None):
    """(first, end) KV tile indices a query tile of rows [i0, i0 + rows) visits: every tile that
    holds a key j < skv with i + lo <= j <= i + hi for some row i of the tile. end <= first means
    none (the rows have no key: output zero)."""
    n = ceildiv(skv, bn)
    first = 0 if lo is None else max(0, i0 + lo) // bn
    if hi is None:
        end = n
    else:
        last_key = i0 + rows - 1 + hi
        end = 0 if last_key < 0 else min(n, last_key // bn + 1)
    if lo is not None and i0 + lo >= skv:
        end = first  # even the first row's band starts past the last key
    if lo is not None and hi is not None and lo > hi:
        end = first  # an empty band: no key anywhere
    return first, end


def _ids_at(ids: np.ndarray, idx) -> np.ndarray:
    """ids[idx] as float32, 0 where idx is past the ids' end (the kernel's predicated loads)."""
    idx = np.asarray(idx)
    got = np.zeros(idx.shape, np.float32)
    ok = idx < ids.shape[0]
    got[ok] = ids[idx[ok]]
    return got


def id_tiles(
    first: int, end: int, i0: int, rows: int, sq: int, skv: int, bn: int, ids: np.ndarray
) -> tuple[int, int]:
    """[first, end) narrowed for a mask term x[i] == x[j], `ids` being x of this batch entry
    (as float32, the kernel's compare; read as 0 past its end, as the kernel's predicated loads
    do): a key can match a row of the tile only if its id lies within [min, max] of the ids of
    the rows i < sq, so the range shrinks to the tiles from the first to the last key in
    [first * bn, min(end * bn, skv)) whose id does. No such key: end = first."""
    ids = np.asarray(ids, dtype=np.float32)

    if end <= first:
        return first, end
    q = _ids_at(ids, np.arange(i0, min(i0 + rows, sq)))
    q = q[~np.isnan(q)]
    if q.size == 0:
        return first, first
    lo, hi = q.min(), q.max()
    j = np.arange(first * bn, min(end * bn, skv))
    kid = _ids_at(ids, j)
    hit = j[(kid >= lo) & (kid <= hi)]
    if hit.size == 0:
        return first, first
    return max(first, int(hit[0]) // bn), min(end, int(hit[-1]) // bn + 1)


def id_pure_tiles(
    first: int, end: int, i0: int, rows: int, sq: int, skv: int, bn: int, ids: np.ndarray
) -> tuple[int, int]:
    """[tpa, tpb): the KV tiles in which every key's id equals the single id of this query
    tile's rows i < sq, for a mask term x[i] == x[j] (the document mask's per-tile flag: such
    a tile needs no id compare). Empty ((0, 0)) unless those rows share one id and none is NaN.
    The kernel's arithmetic (emit.id_scan / id_narrow): over the keys j of the scan range
    [first * bn, min(end * bn, skv)) whose id is not that id (NaN included), pa = 1 + the
    largest such j below i0 (0: none), pb = the smallest such j >= i0 (2^32 - 1: none); every
    scanned key in [pa, pb) then has the id, so tiles [ceil(pa / bn), floor(pb / bn)) do.
    Keys read 0 past the ids' end, as in id_tiles. Right for any ids (a tile of the id that a
    different id separates from i0 keeps the compare)."""
    ids = np.asarray(ids, dtype=np.float32)

    q = _ids_at(ids, np.arange(i0, min(i0 + rows, sq)))
    if q.size == 0 or np.isnan(q).any() or q.min() != q.max():
        return 0, 0
    j = np.arange(first * bn, min(end * bn, skv)) if end > first else np.arange(0)
    miss = j[~(_ids_at(ids, j) == q[0])]
    below, above = miss[miss < i0], miss[miss >= i0]
    pa = int(below.max()) + 1 if below.size else 0
    pb = int(above.min()) if above.size else 2**32 - 1
    return ceildiv(pa, bn), pb // bn


def tile_is_full(
    i0: int, rows: int, j0: int, bn: int, skv: int, lo: int | None, hi: int | None
) -> bool:
    """Whether every (i, j) of the tile is inside the band and every key j < skv: then the
    kernel applies no element mask there (elementwise terms aside)."""
    if j0 + bn > skv:
        return False
    if lo is not None and j0 < i0 + rows - 1 + lo:
        return False
    if hi is not None and j0 + bn - 1 > i0 + hi:
        return False
    return True


def band_columns(
    i: int, j0: int, colb: int, skv: int, lo: int | None, hi: int | None
) -> tuple[int | None, int]:
    """(lo_h, hi_h) of a masked tile's integer band test (emit.band_bounds, s32): the keys
    [i + lo, min(i + hi, skv - 1)] of row i less the thread's first column j0 + colb; the key
    j0 + colb + n is kept when lo_h <= n <= hi_h (lo_h None: no lower bound)."""
    last = skv - 1 if hi is None else min(i + hi, skv - 1)
    return (None if lo is None else i + lo - (j0 + colb)), last - (j0 + colb)


def alibi_side(i0: int, rows: int, j0: int, bn: int) -> int:
    """1 when every key of the tile is at or before every row (j <= i: abs(i - j) = i - j), -1
    when at or after (j >= i), 0 for a tile the diagonal crosses (the per-element form)."""
    if j0 + bn - 1 <= i0:
        return 1
    if j0 >= i0 + rows - 1:
        return -1
    return 0


def _f32(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64).astype(np.float32)


def _fma(a, b, c) -> np.ndarray:
    """fp32 fma: the product and sum in float64 (exact for these operands), rounded once."""
    return _f32(np.float64(1) * np.asarray(a, np.float64) * np.asarray(b, np.float64) + c)


def alibi_bias(coef: float, side: int, i: np.ndarray, j0: int, bn: int) -> np.ndarray:
    """The kernel's base-2 ALiBi bias -coef * abs(i - j) * log2 e on a one-sided tile (rows i,
    keys j0 .. j0 + bn - 1), built as emit.softmax(side=...) does: c = side * fl(coef * log2 e),
    per row and thread column base cb (0, 2, 4, 6: the thread's first column in each group of
    8) b0 = fl(c * (j0 + cb - i)), then at column j0 + cb + n (n = 8 jj + e) fma(c, n, b0): one
    fma a score, no accumulated rounding. Its error against the exact value B is at most
    2^-24 (4 |B| + |c| bn) to first order (c: 2 roundings, b0: one of |c (j0 + cb - i)| <= |B|
    + |c| bn, the fma: one of |b|); the per-element form's is about 3 * 2^-24 |B|."""
    c = _f32(_f32(coef) * np.float32(LOG2E)) * np.float32(side)
    jr = np.arange(bn)
    cb = (jr % 8) // 2 * 2
    n = jr - cb
    d0 = (j0 + cb)[None, :] - np.asarray(i, np.int64).reshape(-1, 1)
    b0 = _f32(np.float64(c) * d0)
    return np.where(n[None, :] == 0, b0, _fma(c, n[None, :], b0))


def query_tile_order(n_tiles: int, band_hi: int | None) -> list[int]:
    """The query tile CTA x takes: with a causal-like band the last tiles have the most keys,
    so they go first (the longest work starts in the first wave)."""
    if band_hi is None:
        return list(range(n_tiles))
    return [n_tiles - 1 - x for x in range(n_tiles)]


def _bf16(a: np.ndarray) -> np.ndarray:
    """Round float32 values to bf16 (nearest even) and back."""
    a = np.asarray(a, dtype=np.float32)
    bits = a.view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def flag_rows(ir, block_m: int, block_n: int) -> int:
    """The rows one of the kernel's band / ALiBi-side flags covers: a warp's WARP_ROWS where
    KV tiles are narrower than query tiles (block_n 64 under block_m 128: a diagonal tile is
    then full for half the warps), else the whole query tile's block_m. Also block_m with
    elementwise terms (a document mask) or an ALiBi score. A flag from %tid.x is not
    CTA-uniform: the 128 x 128 kernels at head dim 128 (and the document's and ALiBi's
    overlapped ones) then spill under nvJitLink's 168 registers, and gain nothing at
    aligned windows (no warp of a 128 x 128 edge tile is wholly inside)."""
    from factory.families.attention.ir import alibi_of

    if ir.elementwise or alibi_of(ir.score) is not None or block_n >= block_m:
        return block_m
    return WARP_ROWS


def id_pure_path(ir) -> bool:
    """Whether the kernel flags tiles by id_pure_tiles: every elementwise term is an id match
    x[i] == x[j] (then a tile whose keys all carry the query tile's one id, band-full, takes
    the unmasked path); any other elementwise term masks every tile."""
    ids = getattr(ir, "id_matches", ())
    return bool(ids) and len(ir.elementwise) == len(ids)


def simulate(
    ir,
    block_m: int,
    block_n: int,
    q,
    k,
    v,
    extra: dict,
    score_fn=None,
    mask_fn=None,
    stats: dict | None = None,
):
    """The kernel's algorithm in numpy: per (b, h, query tile) the visited KV tiles only, fp32
    scores (`score_fn(s, i, j, h, b)` applies the score expression, `mask_fn(i, j, h, b)` the
    elementwise terms and the band on masked tiles; both given by the caller from the IR),
    online softmax in base 2, P rounded to bf16, O and l in fp32. A tile is masked unless the
    kernel's flags say it needs no mask (tile_is_full, and with id matches id_pure_tiles).
    Returns (out, lse, visited) where visited counts the KV tiles computed; `stats` (a dict of
    counters) gets "masked" and "unmasked" tile counts added."""
    if stats is not None:
        stats.setdefault("masked", 0)
        stats.setdefault("unmasked", 0)
    from factory.families.attention.ir import alibi_of

    alibi = alibi_of(ir.score)
    if alibi is not None:
        from factory.spec.attention import _eval_term

        def coef_of(h, b):
            env = {"s": 0.0, "i": 0.0, "j": 0.0, "h": np.float64(h)}
            return float(np.asarray(_eval_term(alibi[1], env, extra, b, {})).reshape(-1)[0])

    bsz, hq, sq, d = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    group = hq // hkv
    out = np.zeros(q.shape, dtype=np.float32)
    lse = np.zeros((bsz, hq, sq), dtype=np.float32)
    visited = 0
    n_q = ceildiv(sq, block_m)
    for b in range(bsz):
        for h in range(hq):
            kh = h // group
            for x in range(n_q):
                qt = query_tile_order(n_q, ir.band_hi)[x]
                i0 = qt * block_m
                rows = np.arange(i0, i0 + block_m)
                qq = np.zeros((block_m, d), np.float32)
                take = min(block_m, sq - i0)
                qq[:take] = q[b, h, i0 : i0 + take]  # the TMA's zero fill past S
                m = np.full(block_m, -np.inf, np.float32)
                l_sum = np.zeros(block_m, np.float32)
                acc = np.zeros((block_m, d), np.float32)
                first, end = kv_tiles(i0, block_m, skv, block_n, ir.band_lo, ir.band_hi)
                band = (first, end)
                pure = []  # per id match: the tiles every key of which has the tile's id
                for name in getattr(ir, "id_matches", ()):
                    x = extra[name]
                    ids = x[b] if np.ndim(x) == 2 else x
                    pure.append(id_pure_tiles(*band, i0, block_m, sq, skv, block_n, ids))
                    first, end = id_tiles(first, end, i0, block_m, sq, skv, block_n, ids)
                for t in range(first, end):
                    visited += 1
                    j0 = t * block_n
                    cols = np.arange(j0, j0 + block_n)
                    kk = np.zeros((block_n, d), np.float32)
                    vv = np.zeros((block_n, d), np.float32)
                    n_keys = min(block_n, skv - j0)
                    kk[:n_keys] = k[b, kh, j0 : j0 + n_keys]
                    vv[:n_keys] = v[b, kh, j0 : j0 + n_keys]
                    s = (qq @ kk.T).astype(np.float32) * np.float32(ir.scale)
                    ii, jj = rows[:, None].astype(np.float32), cols[None, :].astype(np.float32)
                    if score_fn is not None:
                        s = score_fn(s, ii, jj, h, b).astype(np.float32)
                    # the flags the kernel branches on: per tile (the id flag, other
                    # elementwise terms) and per flag_rows rows (the band, ALiBi's side)
                    tile_ok = not ir.elementwise
                    if id_pure_path(ir):  # every elementwise term an id match: its flag
                        tile_ok = all(pa <= t < pb for pa, pb in pure)
                    keep = None
                    x2 = np.empty_like(s)
                    unit = flag_rows(ir, block_m, block_n)
                    for w0 in range(0, block_m, unit):
                        wr = slice(w0, w0 + unit)
                        full = tile_ok and tile_is_full(
                            i0 + w0, unit, j0, block_n, skv, ir.band_lo, ir.band_hi
                        )
                        if stats is not None:
                            stats["unmasked" if full else "masked"] += 1
                        side = alibi_side(i0 + w0, unit, j0, block_n) if alibi else 0
                        if full and side:
                            # the one-sided ALiBi rows: x = fma(acc, k scale log2 e, bias)
                            acc_s = (qq[wr] @ kk.T).astype(np.float32)
                            kl2 = np.float32(alibi[0] * ir.scale * LOG2E)
                            bias = alibi_bias(coef_of(h, b), side, rows[wr], j0, block_n)
                            x2[wr] = _fma(acc_s, kl2, bias)
                            if stats is not None:
                                stats["alibi_sided"] = stats.get("alibi_sided", 0) + 1
                            continue
                        sw = s[wr]
                        if not full:
                            if keep is None:
                                keep = np.broadcast_to(cols[None, :] < skv, s.shape)
                                if mask_fn is not None:
                                    keep = keep & mask_fn(ii, jj, h, b)
                            sw = np.where(keep[wr], sw, -np.inf)
                        x2[wr] = sw * np.float32(LOG2E)
                    m_new = np.maximum(m, x2.max(axis=1))
                    m_use = np.where(np.isfinite(m_new), m_new, 0.0).astype(np.float32)
                    alpha = np.exp2(m - m_use)
                    p = np.exp2(x2 - m_use[:, None])
                    l_sum = l_sum * alpha + p.sum(axis=1)
                    acc = acc * alpha[:, None] + _bf16(p) @ vv
                    m = m_new
                keep_rows = min(block_m, sq - i0)
                ok = l_sum > 0
                o = np.where(ok[:, None], acc / np.where(ok, l_sum, 1)[:, None], 0)
                out[b, h, i0 : i0 + keep_rows] = o[:keep_rows]
                with np.errstate(divide="ignore"):
                    ls = np.where(ok, (m + np.log2(np.where(ok, l_sum, 1))) / LOG2E, -math.inf)
                lse[b, h, i0 : i0 + keep_rows] = ls[:keep_rows]
    return out, lse, visited


def ir_functions(ir):
    """(score_fn, mask_fn) for `simulate` from the IR's expressions (float64 evaluation of the
    same nodes the emitter renders, through factory.spec.attention)."""
    from factory.spec.attention import _eval_term

    def env(s, i, j, h):
        return {"s": s, "i": i, "j": j, "h": np.float64(h)}

    def padded(extra):
        # rows and keys past the sequence read 0, as the kernel's predicated loads do
        return {n: np.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, 256)]) for n, a in extra.items()}

    def score_fn(s, i, j, h, b, extra):
        if ir.score is None:
            return s
        return _eval_term(ir.score, env(s.astype(np.float64), i, j, h), padded(extra), b, {})

    def mask_fn(i, j, h, b, extra):
        extra = padded(extra)
        keep = np.ones(np.broadcast_shapes(i.shape, j.shape), dtype=bool)
        for t in ir.mask:
            keep &= np.broadcast_to(_eval_term(t, env(0.0, i, j, h), extra, b, {}), keep.shape)
        return keep

    return score_fn, mask_fn


def simulate_pipeline(
    n_tiles: int,
    stages: int,
    overlap: bool,
    pingpong: bool,
    consumers: int = 2,
    seed: int = 0,
    max_steps: int = 400000,
    work: list[int] | None = None,
) -> list[tuple[int, str, object]]:
    """The kernel's synchronisation in Python, under a random interleaving: one producer
    thread (per work tile: with `work`, the persistent CTA's tiles, wait until the consumers
    free Q, TMA Q; then per KV tile: wait K's empty barrier, TMA K, wait V's, TMA V),
    `consumers` warpgroups running the simple or the overlapped loop over each work tile (K
    freed once S is done, V after P V, Q once the tile's loop is done), with `pingpong` the
    two named barriers passing the issue turn (given once at the start, taken back once at
    the end). mbarriers complete a phase when their arrivals (and a TMA's bytes) are in;
    try_wait.parity(p) passes while the completed-phase count's parity differs from p. A TMA
    writes its slot when issued (the earliest it could), a wgmma reads its operands when
    issued and when it completes (the earliest and the latest it could); completions happen
    at random later steps. Raises AssertionError on a deadlock, a named-barrier arrival that
    would complete it unseen, or a read of a wrong or unlanded tile; returns the reads
    (consumer, "Q"/"K"/"V", (work tile, KV tile)). `work` None: one work tile of `n_tiles`."""
    import random

    persistent = work is not None
    work = [n_tiles] if work is None else list(work)
    rng = random.Random(seed)
    # (tile, landed) per buffer: the Q tile and each ring slot's K and V
    slots: dict[str, list] = {"Q": [None], "K": [None] * stages, "V": [None] * stages}
    # mbarrier state: [completed phases, arrivals so far in this phase, expected arrivals]
    bars = {("fullQ", 0): [0, 0, 1], ("emptyQ", 0): [0, 0, consumers]}
    for i in range(stages):
        bars[("fullK", i)] = [0, 0, 1]
        bars[("fullV", i)] = [0, 0, 1]
        bars[("emptyK", i)] = [0, 0, consumers]
        bars[("emptyV", i)] = [0, 0, consumers]
    named = {1: [0, []], 2: [0, []]}  # arrivals, waiting consumers
    reads: list[tuple[int, str, object]] = []
    tma: list[tuple[str, int, object]] = []  # in flight: (kind, slot, tile)
    groups: dict[int, list] = {c: [] for c in range(consumers)}  # committed, not complete

    def arrive(key):
        b = bars[key]
        b[1] += 1
        if b[1] == b[2]:
            b[0], b[1] = b[0] + 1, 0

    def passed(key, parity):
        return bars[key][0] % 2 != parity

    def load(kind, slot, tile):
        slots[kind][slot] = (tile, False)  # the TMA may write as soon as it is issued
        tma.append((kind, slot, tile))

    def producer():
        stage, phase, qit = 0, 0, 0
        for w, n in enumerate(work):
            if persistent:
                while not passed(("emptyQ", 0), qit ^ 1):
                    yield
            load("Q", 0, w)
            for t in range(n):
                for kind in ("K", "V"):
                    while not passed((f"empty{kind}", stage), phase ^ 1):
                        yield
                    load(kind, stage, (w, t))
                stage += 1
                if stage == stages:
                    stage, phase = 0, phase ^ 1
            qit ^= 1

    def check(c, kind, slot, want):
        got = slots[kind][slot]
        assert got == (want, True), f"consumer {c} read {kind} slot {slot}: {got}, not {want}"

    def issue(c, operands):
        for op in operands:
            check(c, *op)
        groups[c].append(operands)

    def complete_group(c):
        for kind, slot, want in groups[c].pop(0):
            check(c, kind, slot, want)
            reads.append((c, kind, want))

    def named_arrive(bid):
        # an arrival with the other's already in and nobody waiting would complete the
        # barrier unseen (a lost turn)
        assert named[bid][0] == 0 or named[bid][1], f"named barrier {bid}: turn passed twice"
        named[bid][0] += 1

    def consumer(c):
        mine, other = 1 + c, 2 - c

        def wait_bar(key, parity):
            while not passed(key, parity):
                yield

        def named_sync(bid):
            named[bid][0] += 1
            named[bid][1].append(c)
            while c in named[bid][1]:
                yield

        def turn():
            if pingpong:
                yield from named_sync(mine)

        def pass_turn():
            if pingpong:
                named_arrive(other)

        def wait_group(n):
            while len(groups[c]) > n:  # the groups complete, oldest first, as random events
                yield

        def s_of(w, stage, t):
            return [("Q", 0, w), ("K", stage, (w, t))]

        stage, phase, qit = 0, 0, 0
        if pingpong and c == 1:
            named_arrive(1)
        for w, n in enumerate(work):
            yield from wait_bar(("fullQ", 0), qit)
            if not overlap:
                for t in range(n):
                    yield from wait_bar(("fullK", stage), phase)
                    issue(c, s_of(w, stage, t))
                    yield from wait_group(0)
                    arrive(("emptyK", stage))
                    yield from wait_bar(("fullV", stage), phase)
                    issue(c, [("V", stage, (w, t))])
                    yield from wait_group(0)
                    arrive(("emptyV", stage))
                    stage += 1
                    if stage == stages:
                        stage, phase = 0, phase ^ 1
            elif n:
                yield from wait_bar(("fullK", stage), phase)
                yield from turn()
                issue(c, s_of(w, stage, 0))
                pass_turn()
                yield from wait_group(0)
                arrive(("emptyK", stage))
                poff, pphase = stage, phase
                stage += 1
                if stage == stages:
                    stage, phase = 0, phase ^ 1
                for t in range(1, n):
                    yield from wait_bar(("fullK", stage), phase)
                    yield from wait_bar(("fullV", poff), pphase)
                    yield from turn()
                    issue(c, s_of(w, stage, t))
                    issue(c, [("V", poff, (w, t - 1))])
                    pass_turn()
                    yield from wait_group(1)
                    arrive(("emptyK", stage))
                    yield from wait_group(0)
                    arrive(("emptyV", poff))
                    poff, pphase = stage, phase
                    stage += 1
                    if stage == stages:
                        stage, phase = 0, phase ^ 1
                yield from wait_bar(("fullV", poff), pphase)
                yield from turn()
                issue(c, [("V", poff, (w, n - 1))])
                pass_turn()
                yield from wait_group(0)
                arrive(("emptyV", poff))
            if persistent:
                arrive(("emptyQ", 0))
            qit ^= 1
        if pingpong and c == 0:
            yield from named_sync(1)

    procs = {"p": producer(), **{c: consumer(c) for c in range(consumers)}}
    steps = 0
    while procs:
        steps += 1
        assert steps < max_steps, "no progress: deadlock"
        for bid, (count, waiting) in named.items():
            if count >= 2 and waiting:  # 256 threads: one warpgroup waits, the other arrived
                named[bid] = [count - 2, []]
        events = list(procs) + (["tma"] if tma else [])
        events += [("wg", c) for c in groups if groups[c]]
        ev = rng.choice(events)
        if ev == "tma":
            kind, slot, t = tma.pop(rng.randrange(len(tma)))
            if slots[kind][slot] == (t, False):
                slots[kind][slot] = (t, True)
            arrive((f"full{kind}", slot))
        elif isinstance(ev, tuple):
            complete_group(ev[1])
        else:
            try:
                next(procs[ev])
            except StopIteration:
                del procs[ev]
    assert not tma and all(not g for g in groups.values())
    assert all(count == 0 for count, _ in named.values()), named
    return reads
