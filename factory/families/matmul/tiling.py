"""The index arithmetic of the wgmma GEMM kernel, in plain Python.

The emitter writes these same formulas in PTX; tests run a numpy model of the kernel's tile loop
through these functions (tiles in grouped order, TMA boxes with zero fill, the 128-byte swizzle,
wgmma's descriptor addressing and its accumulator fragment, guarded stores) and compare with a
direct product, so that a slip in the arithmetic shows without a GPU.
"""

from __future__ import annotations


def ceildiv(a: int, b: int) -> int:
    return -(-a // b)


def tile_coords(t: int, tiles_m: int, tiles_n: int, group_m: int) -> tuple[int, int]:
    """(tile row, tile column) of linear tile t: groups of `group_m` tile rows, each walked
    column by column, rows fastest, so that consecutive tiles share B columns and a group's A
    rows stay in L2."""
    per_group = group_m * tiles_n
    grp = t // per_group
    first = grp * group_m
    rows = min(tiles_m - first, group_m)
    within = t - grp * per_group
    return first + within % rows, within // rows


def cta_tiles(cta: int, ctas: int, tiles: int) -> list[int]:
    """The linear tiles a persistent CTA walks: cta, cta + ctas, ..."""
    return list(range(cta, tiles, ctas))


def swizzle128(row: int, chunk: int) -> int:
    """Byte offset inside a 1024-byte aligned tile of 128-byte rows where the TMA writes the
    16-byte chunk `chunk` (0..7) of row `row` under CU_TENSOR_MAP_SWIZZLE_128B."""
    return row * 128 + ((chunk ^ (row % 8)) * 16)


def wgmma_k_major_offset(start: int, row: int, kbyte: int) -> int:
    """The byte wgmma reads, for a K-major operand with 128-byte swizzle, at `row` (M or N)
    and byte `kbyte` (< 32: one k16 slice of bf16) of the slice whose descriptor start
    address is `start` (the tile base plus 32 bytes per k16 step). Rows are 128 bytes apart,
    8-row groups 1024 bytes apart (the descriptor's stride byte offset); the hardware XORs
    address bits 4-6 with bits 7-9 of the full address."""
    addr = start + (row // 8) * 1024 + (row % 8) * 128 + kbyte
    return addr ^ (((addr >> 7) & 7) << 4)


def fragment(warp: int, lane: int, reg: int) -> tuple[int, int]:
    """(row, column) inside the 64 x N accumulator of wgmma m64nNk16 (f32) held by register
    `reg` of thread (warp, lane) of the warpgroup."""
    j, h, e = reg // 4, (reg // 2) % 2, reg % 2
    return 16 * warp + lane // 4 + 8 * h, 8 * j + 2 * (lane % 4) + e


def simulate_ring(
    tiles: int, nk: int, stages: int, pingpong: bool, seed: int = 0, ordered: bool = True
) -> list[tuple[int, int]]:
    """Run the kernel's mbarrier protocol for one CTA under a random interleaving and return
    what each consumer read, as (consumer, ring position) pairs in read order.

    The model: ring position p (the p-th k-block the producer loads) uses slot p % stages; a
    slot's "full" and "empty" barriers count completed phases, and a parity wait for parity P
    passes when the count of completed phases is odd/even opposite to P (a fresh barrier passes a
    wait for parity 1). The producer waits empty(p % S) with parity ((p // S) & 1) ^ 1, then its
    load lands at some later moment (completing full's phase); a consumer waits full with parity
    (p // S) & 1, asserts the slot holds position p, and releases the slot one k-block later
    (wgmma.wait_group 1) or at its tile's end. Cooperative: both consumers read every position
    and each slot's empty barrier completes after both released it. Ping-pong: tile i belongs to
    consumer i % 2 and, with `ordered`, a consumer starts a tile's main loop only after the other
    consumer has waited on the previous tile's last k-block (the named barriers). Raises
    AssertionError on a wrong read or a deadlock."""
    import random

    rng = random.Random(seed)
    n_cons = 2
    full = [0] * stages
    empty = [0] * stages
    empty_arrivals = [0] * stages
    slot_data = [None] * stages
    in_flight: list[tuple[int, int]] = []  # (slot, position) loads not yet landed
    releasers = 1 if pingpong else n_cons
    done_main = [-1] * n_cons  # last tile index whose main loop each consumer finished
    reads: list[tuple[int, int]] = []

    def passes(count: int, parity: int) -> bool:
        return (count & 1) != parity

    def producer():
        for p in range(tiles * nk):
            s = p % stages
            while not passes(empty[s], ((p // stages) & 1) ^ 1):
                yield False
            in_flight.append((s, p))
            yield True

    def release(s: int):
        empty_arrivals[s] += 1
        if empty_arrivals[s] == releasers:
            empty_arrivals[s] = 0
            empty[s] += 1

    def consumer(c: int):
        mine = [i for i in range(tiles) if not pingpong or i % 2 == c]
        for i in mine:
            if pingpong and ordered and i > 0:
                while done_main[1 - c] < i - 1:
                    yield False
            prev = None
            for kb in range(nk):
                p = i * nk + kb
                s = p % stages
                while not passes(full[s], (p // stages) & 1):
                    yield False
                assert slot_data[s] == p, f"consumer {c} read slot {s} for {p}: {slot_data[s]}"
                reads.append((c, p))
                if prev is not None:
                    release(prev)
                prev = s
                yield True
            done_main[c] = i
            release(prev)
            yield True

    actors = [producer()] + [consumer(c) for c in range(n_cons)]
    alive = list(range(len(actors)))
    stalled = 0
    while alive or in_flight:
        choices = alive + (["land"] if in_flight else [])
        pick = rng.choice(choices)
        if pick == "land":
            s, p = in_flight.pop(rng.randrange(len(in_flight)))
            slot_data[s] = p
            full[s] += 1
            stalled = 0
            continue
        try:
            progressed = next(actors[pick])
        except StopIteration:
            alive.remove(pick)
            continue
        stalled = 0 if progressed else stalled + 1
        assert stalled < 10000, "deadlock"
    return reads


def simulate_cluster_ring(
    units: int, nk: int, stages: int, seed: int = 0, remote_release: bool = True
) -> list[tuple[int, int, int]]:
    """The 2x1 cluster's ring under a random interleaving: two CTAs, each with a producer and
    two consumers. Per ring position a CTA's slot receives three parts: its own A, and the two
    halves of B, one multicast by each CTA's producer into both CTAs. A full barrier completes
    once its producer's arrive.expect_tx has come (count 1) and all three parts have landed (the
    byte count may go below zero first: a peer's half can land before the local expect). A
    producer waits only for its own CTA's empty barrier, so every consumer warp releases the
    slot in both CTAs (remote_release; False models releasing only locally, with the count
    halved). A slot a consumer is still reading must not be overwritten. Returns
    (cta, consumer, position) per read; AssertionError on a wrong or torn read, or deadlock."""
    import random

    rng = random.Random(seed)
    parts = ("a", "b0", "b1")
    full = [[0] * stages for _ in range(2)]  # completed phases
    full_arrived = [[0] * stages for _ in range(2)]
    full_tx = [[0] * stages for _ in range(2)]
    empty = [[0] * stages for _ in range(2)]
    empty_arrivals = [[0] * stages for _ in range(2)]
    releasers = 2 * 2 if remote_release else 2  # consumers per CTA x CTAs releasing
    data = [[dict.fromkeys(parts) for _ in range(stages)] for _ in range(2)]
    in_flight: list[tuple[int, int, str, int]] = []  # (cta, slot, part, position)
    reads: list[tuple[int, int, int]] = []

    def passes(count: int, parity: int) -> bool:
        return (count & 1) != parity

    def try_complete_full(c: int, s: int):
        if full_arrived[c][s] == 1 and full_tx[c][s] == 0:
            full_arrived[c][s] = 0
            full[c][s] += 1

    def producer(c: int):
        for p in range(units * nk):
            s = p % stages
            while not passes(empty[c][s], ((p // stages) & 1) ^ 1):
                yield False
            full_arrived[c][s] += 1
            full_tx[c][s] += len(parts)
            try_complete_full(c, s)
            in_flight.append((c, s, "a", p))
            for dst in (0, 1):  # the multicast of this CTA's B half
                in_flight.append((dst, s, f"b{c}", p))
            yield True

    def release(c: int, s: int, p: int):
        assert all(data[c][s][x] == p for x in parts), f"CTA {c} slot {s} overwritten while read"
        for dst in (0, 1) if remote_release else (c,):
            empty_arrivals[dst][s] += 1
            if empty_arrivals[dst][s] == releasers:
                empty_arrivals[dst][s] = 0
                empty[dst][s] += 1

    def consumer(c: int, w: int):
        prev = None
        for p in range(units * nk):
            s = p % stages
            while not passes(full[c][s], (p // stages) & 1):
                yield False
            assert all(data[c][s][x] == p for x in parts), f"CTA {c} read {data[c][s]} for {p}"
            reads.append((c, w, p))
            if prev is not None:
                release(c, *prev)
            prev = (s, p)
            yield True
        release(c, *prev)
        yield True

    actors = [producer(0), producer(1)] + [consumer(c, w) for c in (0, 1) for w in (0, 1)]
    alive = list(range(len(actors)))
    stalled = 0
    while alive or in_flight:
        choices = alive + (["land"] if in_flight else [])
        pick = rng.choice(choices)
        if pick == "land":
            c, s, part, p = in_flight.pop(rng.randrange(len(in_flight)))
            data[c][s][part] = p
            full_tx[c][s] -= 1
            try_complete_full(c, s)
            stalled = 0
            continue
        try:
            progressed = next(actors[pick])
        except StopIteration:
            alive.remove(pick)
            continue
        stalled = 0 if progressed else stalled + 1
        assert stalled < 10000, "deadlock"
    return reads


def splitk_range(rank: int, nk: int, split_k: int) -> tuple[int, int]:
    """The k-blocks [kb0, kb1) CTA `rank` of a split-K cluster sums (empty when nk < split_k)."""
    return rank * nk // split_k, (rank + 1) * nk // split_k


def splitk_share(rank: int, blocks: int, split_k: int) -> range:
    """The 8-column blocks of the tile whose sum and epilogue CTA `rank` takes."""
    return range(rank * blocks // split_k, (rank + 1) * blocks // split_k)


def splitk_partial_offset(acc: int, group: int, thread: int, blocks: int, threads: int) -> int:
    """Byte offset in a CTA's shared memory of the 4 fp32 registers 4 * group .. 4 * group + 3
    (column block `group` of the fragment) of accumulator `acc` held by consumer thread `thread`
    (0 .. threads - 1): thread-major 16-byte slots, so a warp's stores are contiguous."""
    return ((acc * blocks + group) * threads + thread) * 16


def simulate_splitk(a, b, tile_m: int, tile_n: int, consumers: int, split_k: int, b2=None) -> tuple:
    """A numpy model of the split-K kernel: per output tile, CTA r of the cluster accumulates the
    k-blocks of splitk_range (TMA boxes zero-filled past K, M, N), stores its fragment registers
    to its shared memory at splitk_partial_offset, then sums its share (splitk_share) of every
    CTA's partials in rank order and stores the in-bounds elements. Returns (C, C2) (C2 for
    b2); every output element must be written exactly once (AssertionError otherwise) and every
    partial slot written once within the tile_m * tile_n * 4 bytes per accumulator."""
    import numpy as np

    m, k = a.shape
    n = b.shape[0]
    nk = ceildiv(k, 64)
    rows_c = tile_m // consumers
    blocks = tile_n // 8
    threads = 128 * consumers
    weights = [b] + ([b2] if b2 is not None else [])
    outs = [np.full((m, n), np.nan) for _ in weights]
    written = np.zeros((m, n), dtype=int)
    part_words = len(weights) * tile_m * tile_n  # fp32 words of one partial
    for tm in range(ceildiv(m, tile_m)):
        for tn in range(ceildiv(n, tile_n)):
            smem = []
            for r in range(split_k):
                kb0, kb1 = splitk_range(r, nk, split_k)
                mem = np.full(part_words, np.nan)
                for ai, w in enumerate(weights):
                    box_a = np.zeros((tile_m, (kb1 - kb0) * 64))
                    blk = a[tm * tile_m : (tm + 1) * tile_m, kb0 * 64 : kb1 * 64]
                    box_a[: blk.shape[0], : blk.shape[1]] = blk
                    box_b = np.zeros((tile_n, (kb1 - kb0) * 64))
                    blk = w[tn * tile_n : (tn + 1) * tile_n, kb0 * 64 : kb1 * 64]
                    box_b[: blk.shape[0], : blk.shape[1]] = blk
                    acc = box_a @ box_b.T  # zeros when the range is empty
                    for c in range(consumers):
                        for t in range(128):
                            warp, lane = t // 32, t % 32
                            for g in range(blocks):
                                off = splitk_partial_offset(ai, g, 128 * c + t, blocks, threads)
                                assert 0 <= off and off + 16 <= part_words * 4
                                for e in range(4):
                                    fr, fc = fragment(warp, lane, 4 * g + e)
                                    assert np.isnan(mem[off // 4 + e]), "slot written twice"
                                    mem[off // 4 + e] = acc[rows_c * c + fr, fc]
                smem.append(mem)
            for r in range(split_k):
                for c in range(consumers):
                    for t in range(128):
                        warp, lane = t // 32, t % 32
                        for ai in range(len(weights)):
                            for g in splitk_share(r, blocks, split_k):
                                off = splitk_partial_offset(ai, g, 128 * c + t, blocks, threads)
                                for e in range(4):
                                    v = smem[0][off // 4 + e]
                                    for q in range(1, split_k):
                                        v = v + smem[q][off // 4 + e]
                                    fr, fc = fragment(warp, lane, 4 * g + e)
                                    row = tm * tile_m + rows_c * c + fr
                                    col = tn * tile_n + fc
                                    if row < m and col < n:
                                        outs[ai][row, col] = v
                                        if ai == 0:
                                            written[row, col] += 1
    assert (written == 1).all(), "an output element written other than once"
    return tuple(outs)


def scale_group(tile_col: int, tile_n: int, lane: int, j: int) -> int:
    """The 128-column scale group of a group-scaled fp8 output that column block j of thread
    `lane` falls in, as the epilogue computes it: (col0 >> 7) + j // 16, col0 = the tile's first
    column + 2 (lane % 4) (the tile's first column a multiple of 128)."""
    col0 = tile_col * tile_n + 2 * (lane % 4)
    return (col0 >> 7) + j // 16


def staged_offset(warp: int, lane: int, j: int, h: int, e: int, slots: int, elem: int = 2) -> int:
    """Byte offset in a consumer warpgroup's staging buffer (schedule.tma_store) where the
    TMA-store epilogue writes register 4j + 2h + e of thread (warp, lane), as the emitter computes
    it. 16-bit outputs (elem 2): slot (j // 8) % slots of 8 KB, row 16 warp + lane / 4 + 8 h at
    128 bytes, the 16-byte chunk j % 8 XORed with lane / 4 (= row % 8), 4 bytes per lane % 4 and
    2 per e. fp8 outputs (elem 1: boxes of 128 columns): slot (j // 16) % slots, the chunk
    (j % 16) / 2 XORed the same way, 8 bytes per j % 2, 2 per lane % 4 and 1 per e."""
    row = 16 * warp + lane // 4
    if elem == 2:
        xor = ((j % 8) * 16) ^ ((lane // 4) * 16)
        return ((j // 8) % slots) * 8192 + row * 128 + (lane % 4) * 4 + xor + h * 1024 + 2 * e
    xor = (((j % 16) // 2) * 16) ^ ((lane // 4) * 16)
    return (
        ((j // 16) % slots) * 8192 + row * 128 + (lane % 4) * 2 + xor + 8 * (j % 2) + h * 1024 + e
    )


def simulate_tma_store(
    c,
    tile_n: int,
    slots: int,
    seed: int = 0,
    pending_allowed: int | None = None,
    read_chance: float = 1 / 2048,
) -> tuple:
    """A model of one consumer warpgroup's TMA-store epilogue over the 64-row bands of `c`
    (M x N, the values its accumulators hold), its tiles walked band by band and tile column by
    tile column. Per box q of a tile (64 columns): the first thread waits until at most
    `pending_allowed` (default slots - 1) of its box stores still read shared memory, every
    thread writes its registers at staged_offset, then the box's store is issued. The TMA
    engine reads a pending store's slot at a random later moment (after any thread's write with
    probability `read_chance`; oldest first, as wait_group counts them) and writes the box to
    the output, clipped to M x N; every element it reads must have been written for that box
    (not yet overwritten by a later one). Returns (the output, the most stores ever pending);
    AssertionError on a torn read or an output element not stored exactly once."""
    import random

    import numpy as np

    rng = random.Random(seed)
    allowed = slots - 1 if pending_allowed is None else pending_allowed
    m, n = c.shape
    staging = np.full(slots * 4096, np.nan)  # 16-bit elements
    owner = np.full(slots * 4096, -1)  # which box last wrote each element
    out = np.full((m, n), np.nan)
    stored = np.zeros((m, n), dtype=int)
    pending: list[tuple[int, int, int, int]] = []  # (box id, slot, first row, first column)
    most = 0

    def engine_reads_oldest():
        box, slot, r0, c0 = pending.pop(0)
        for r in range(64):
            for cc in range(64):
                idx = (slot * 8192 + swizzle128(r, cc // 8) + (cc % 8) * 2) // 2
                assert owner[idx] == box, f"box {box} slot {slot} overwritten before its store"
                if r0 + r < m and c0 + cc < n:
                    out[r0 + r, c0 + cc] = staging[idx]
                    stored[r0 + r, c0 + cc] += 1

    box_id = 0
    for r0 in range(0, m, 64):
        for t0 in range(0, n, tile_n):
            for q in range(tile_n // 64):
                while len(pending) > allowed:  # cp.async.bulk.wait_group.read
                    engine_reads_oldest()
                writes = [
                    (w, lane, j, h, e)
                    for w in range(4)
                    for lane in range(32)
                    for j in range(8 * q, 8 * q + 8)
                    for h in (0, 1)
                    for e in (0, 1)
                ]
                rng.shuffle(writes)
                for w, lane, j, h, e in writes:
                    if pending and rng.random() < read_chance:
                        engine_reads_oldest()  # the TMA may read at any moment
                    off = staged_offset(w, lane, j, h, e, slots)
                    assert off % 2 == 0 and 0 <= off < slots * 8192
                    row, col = fragment(w, lane, 4 * j + 2 * h + e)
                    gr, gc = r0 + row, t0 + col
                    staging[off // 2] = c[gr, gc] if gr < m and gc < n else 0.0
                    owner[off // 2] = box_id
                pending.append((box_id, (q % slots), r0, t0 + 64 * q))
                most = max(most, len(pending))
                box_id += 1
    while pending:
        engine_reads_oldest()
    assert (stored == 1).all(), "an output element stored other than once"
    return out, most


# ---- cp.async loads (schedule load = "cp_async") ------------------------------------------------

PRODUCER_THREADS = 128


def cp_async_thread(t: int) -> tuple[int, int, int]:
    """(first row r0, chunk c, destination byte offset) of producer thread t (0..127) under the
    cp.async load path: it copies chunk c = t % 8 (16 bytes, k elements 8c..8c+7 of a 64-k
    sub-block) of rows r0 + 16 i, r0 = t // 8, to dst + 2048 i, dst = r0 * 128 + (c ^ r0 % 8)
    * 16 (rows 16 apart share r0 % 8, so only the row term moves)."""
    r0, c = t // 8, t % 8
    return r0, c, r0 * 128 + ((c ^ (r0 % 8)) * 16)


def cp_async_tile(src, row0: int, k0: int, rows: int):
    """The shared-memory tile (rows x 64 elements, as a flat array in 16-bit element units) the
    producer warpgroup's chunks write for rows row0.. of `src` (R x K, row-major) at k0.., with
    the emitter's predicate per chunk: ignore the source (zero fill) when rows_left <= 16 i
    (rows_left = R - (row0 + r0), signed) or K - k0 <= 8c. AssertionError if a byte of the tile
    is written other than once."""
    import numpy as np

    n_rows, k = src.shape
    tile = np.full(rows * 64, np.nan)
    written = np.zeros(rows * 64, dtype=int)
    for t in range(PRODUCER_THREADS):
        r0, c, dst = cp_async_thread(t)
        left = n_rows - (row0 + r0)
        past_k = k - k0 <= 8 * c
        for i in range(rows // 16):
            off = (dst + 2048 * i) // 2
            if left <= 16 * i or past_k:
                tile[off : off + 8] = 0.0
            else:
                g = row0 + r0 + 16 * i
                tile[off : off + 8] = src[g, k0 + 8 * c : k0 + 8 * c + 8]
            written[off : off + 8] += 1
    assert (written == 1).all(), "a tile element written other than once"
    return tile


def tma_tile(src, row0: int, k0: int, rows: int):
    """The same tile as the TMA writes it: the box rows x 64 at (row0, k0), zero past the
    tensor, each 16-byte chunk c of row r at swizzle128(r, c)."""
    import numpy as np

    box = np.zeros((rows, 64))
    blk = src[row0 : row0 + rows, k0 : k0 + 64]
    box[: blk.shape[0], : blk.shape[1]] = blk
    tile = np.full(rows * 64, np.nan)
    for r in range(rows):
        for c in range(8):
            off = swizzle128(r, c) // 2
            tile[off : off + 8] = box[r, 8 * c : 8 * c + 8]
    return tile
