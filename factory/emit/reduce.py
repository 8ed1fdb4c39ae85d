"""Reductions across the threads of a kernel, as PTX: a library every family's emitter shares.

Each function takes the `Builder` and the registers (names from `Builder.reg`) that hold the
values, emits the instructions where it is called, and leaves the result in the registers it was
given (or returns a new one, where it says so). What a function needs from the kernel around it
is a parameter, documented where it is taken:

- lanes: a butterfly exchanges over the xor `offsets` (powers of two below the lanes a value
  spans: (16, 8, 4, 2, 1) for a warp; fewer for a group of T < 32 lanes, which stays inside its
  aligned lanes). Every lane of the warp must reach each shuffle: the mask is full (-1).
- shared memory: `WarpSlots` names the slots through which the warps of a group meet, one f32
  word per warp per slot, laid out [group][slot][warp], and the barrier all those warps reach.
- clusters: `ClusterSlots` names the two-word slots each block publishes for the blocks of its
  cluster (distributed shared memory, sm_90+), and the predicate of the one thread that writes.

Values are f32. Four kinds of reduction:

- plain (`COMBINE`: sum, mean, max, min): one register per value;
- online max/sum pairs (m, s): s is the sum of exp(v - m) over the values seen, m their max; two
  pairs combine by rescaling each sum to the larger max (`pair_combine`);
- moments (n, mean, M2): count, mean and squared deviations from the mean, merged by Chan's
  formula (`chan_merge`), so that a variance needs one pass over the data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from factory.emit.ptx import LOG2E, Builder, f32_literal

NEG_INF = float("-inf")
# The identity of each plain reduction and the instruction that combines two partial values.
IDENTITY = {"sum": 0.0, "mean": 0.0, "max": float("-inf"), "min": float("inf")}
COMBINE = {"sum": "add.f32", "mean": "add.f32", "max": "max.f32", "min": "min.f32"}
WARP_OFFSETS = (16, 8, 4, 2, 1)


def butterfly_offsets(lanes: int) -> list[int]:
    """The xor offsets of a butterfly over groups of `lanes` aligned lanes (a power of two; 32
    or more: the whole warp)."""
    return [o for o in WARP_OFFSETS if o < lanes]


# ---------------------------------------------------------------- within a thread


def tree(b: Builder, op: str, vals: list[str], dst: str | None = None, kind: str = "f32") -> str:
    """vals folded pairwise by `op` ("add.f32", "max.f32", "max.bf16x2", ...): depth log2(len)
    instead of a chain of len - 1. The root goes to `dst` when given (it may be one of vals);
    `kind` is the register type of the intermediate values. Returns the root's register."""
    level = list(vals)
    while len(level) > 1:
        nxt = []
        for i in range(0, len(level) - 1, 2):
            last = len(level) == 2
            r = dst if (last and dst is not None) else b.reg(kind)
            b.op(f"{op} {r}, {level[i]}, {level[i + 1]}")
            nxt.append(r)
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    if dst is not None and level[0] != dst:
        b.op(f"mov.{kind} {dst}, {level[0]}")
    return dst if dst is not None else level[0]


def fold(b: Builder, op: str, vals: list[str], by_tree: bool) -> str:
    """vals (f32) folded by `op`: by a tree (`tree`), else as a chain from the left. Returns the
    register of the result (vals[0] itself for a single value)."""
    if by_tree:
        return tree(b, op, vals)
    acc = vals[0]
    for v in vals[1:]:
        r = b.reg("f32")
        b.op(f"{op} {r}, {acc}, {v}")
        acc = r
    return acc


# ---------------------------------------------------------------- online max and sum


def safe_max(b: Builder, mn: str) -> str:
    """A new register: the max `mn`, with an all -inf max taken as 0 so that
    exp(-inf - -inf) is 0, not NaN."""
    pinf = b.reg("pred")
    b.op(f"setp.eq.f32 {pinf}, {mn}, {f32_literal(NEG_INF)}")
    ms = b.reg("f32")
    b.op(f"selp.f32 {ms}, 0f00000000, {mn}, {pinf}")
    return ms


def exp_below(b: Builder, v: str, ms: str) -> str:
    """A new register: exp(v - ms) for v <= ms, the difference taken first: exactly 1 at v == ms
    however large |v| is. (An fma of v*log2(e) against a rounded -ms*log2(e) leaves that
    rounding, up to 1e23 for a -1e30 mask value, and its exp2 is inf: a masked softmax whose
    thread sees only masked elements would come out NaN.)"""
    t = b.reg("f32")
    b.op(f"sub.f32 {t}, {v}, {ms}")
    b.op(f"mul.f32 {t}, {t}, {f32_literal(LOG2E)}")
    b.op(f"ex2.approx.ftz.f32 {t}, {t}")
    return t


def online_fold(
    b: Builder,
    m: str,
    s: str,
    gm: str,
    values: Iterable[str],
    *,
    by_tree: bool,
    exps_first: bool = False,
) -> None:
    """(m, s) += a group of values whose max is `gm`: s rescaled to the new max, then the
    group's exponentials added (a tree under `by_tree`, else one after another; `exps_first`:
    every exponential written before the first add). `values` is consumed after the new max is
    known, so lazily made values are emitted there."""
    mn = b.reg("f32")
    b.op(f"max.f32 {mn}, {m}, {gm}")
    ms = safe_max(b, mn)
    b.op(f"mul.f32 {s}, {s}, {exp_below(b, m, ms)}")
    if by_tree:
        t = tree(b, "add.f32", [exp_below(b, v, ms) for v in values])
        b.op(f"add.f32 {s}, {s}, {t}")
    elif exps_first:
        for e in [exp_below(b, v, ms) for v in values]:
            b.op(f"add.f32 {s}, {s}, {e}")
    else:
        for v in values:
            b.op(f"add.f32 {s}, {s}, {exp_below(b, v, ms)}")
    b.op(f"mov.f32 {m}, {mn}")


def online_update(b: Builder, m: str, s: str, vals: list[str], *, by_tree: bool) -> None:
    """Fold a group of f32 values into (running max m, running sum s of exp(v - m)): the group's
    max (`fold`), then `online_fold`."""
    b.comment("online max/sum over this group" + (", by trees" if by_tree else ""))
    online_fold(b, m, s, fold(b, "max.f32", vals, by_tree), iter(vals), by_tree=by_tree)


def online_update_packed(
    b: Builder,
    m: str,
    s: str,
    words: list[str],
    dtype: str,
    unpack: Callable[[str, int], str],
    *,
    by_tree: bool,
) -> None:
    """`online_update` over 16-bit elements (`dtype` "bf16" or "fp16") packed two to a b32 word
    in `words`: the max by a tree of packed max instructions, then each element unpacked for
    its exponential. `unpack(word, half)` emits the f32 of element `half` (0 = low) of a word
    and returns its register."""
    b.comment("online max/sum over this group, the max on packed pairs")
    w = tree(b, "max.bf16x2" if dtype == "bf16" else "max.f16x2", words, kind="b32")
    gm = b.reg("f32")
    b.op(f"max.f32 {gm}, {unpack(w, 0)}, {unpack(w, 1)}")
    unpacked = (unpack(word, half) for word in words for half in (0, 1))
    online_fold(b, m, s, gm, unpacked, by_tree=by_tree, exps_first=True)


def pair_combine(b: Builder, m: str, s: str, mo: str, so: str) -> None:
    """(m, s) <- (m, s) combined with another pair (mo, so): both sums rescaled to the larger
    max."""
    mn = b.reg("f32")
    b.op(f"max.f32 {mn}, {m}, {mo}")
    ms = safe_max(b, mn)
    a = exp_below(b, m, ms)
    c = exp_below(b, mo, ms)
    t = b.reg("f32")
    b.op(f"mul.f32 {t}, {so}, {c}")
    b.op(f"fma.rn.f32 {s}, {s}, {a}, {t}")
    b.op(f"mov.f32 {m}, {mn}")


# ---------------------------------------------------------------- moments (Chan)


def rcp_count(b: Builder, count: str) -> str:
    """A new register: 1 / max(count, 1), so that an empty group (a thread past the row's end)
    divides by one."""
    inv = b.reg("f32")
    b.op(f"max.f32 {inv}, {count}, 0f3F800000")
    b.op(f"rcp.rn.f32 {inv}, {inv}")
    return inv


def chan_merge(b: Builder, acc, other) -> None:
    """acc <- acc merged with other, each (count, mean, squared deviations from the mean):
    n = na + nb, mean = ma + d nb / n, M2 = M2a + M2b + d^2 na nb / n with d = mb - ma."""
    n, m, m2 = acc
    nb, mb, m2b = other
    nn, f, d, t = (b.reg("f32") for _ in range(4))
    b.op(f"add.f32 {nn}, {n}, {nb}")
    b.op(f"mul.f32 {f}, {nb}, {rcp_count(b, nn)}")
    b.op(f"sub.f32 {d}, {mb}, {m}")
    b.op(f"fma.rn.f32 {m}, {d}, {f}, {m}")
    b.op(f"mul.f32 {t}, {d}, {f}")
    b.op(f"mul.f32 {t}, {t}, {d}")
    b.op(f"add.f32 {m2}, {m2}, {m2b}")
    b.op(f"fma.rn.f32 {m2}, {t}, {n}, {m2}")
    b.op(f"mov.f32 {n}, {nn}")


def group_moments(
    b: Builder, acc, values: Callable[[], Iterable[str]], preds: list[str | None]
) -> None:
    """Merge one thread's group of values into the triple `acc` (`chan_merge`): the group's own
    mean first, then its deviations from it, each a sweep over `values()` (called twice, so
    that nothing is held between the sweeps but what the values are made from). preds[i] is
    the predicate under which value i counts; all None: every value counts, and the count is
    len(preds) without an instruction per value."""
    fast = all(p is None for p in preds)
    cnt, total = b.reg("f32"), b.reg("f32")
    b.op(f"mov.f32 {total}, 0f00000000")
    if fast:
        b.op(f"mov.f32 {cnt}, {f32_literal(float(len(preds)))}")
    else:
        b.op(f"mov.f32 {cnt}, 0f00000000")
    for v, pr in zip(values(), preds, strict=True):
        if pr is None:
            b.op(f"add.f32 {total}, {total}, {v}")
        else:
            b.op(f"@{pr} add.f32 {total}, {total}, {v}")
            b.op(f"@{pr} add.f32 {cnt}, {cnt}, 0f3F800000")
    mean = b.reg("f32")
    b.op(f"mul.f32 {mean}, {total}, {rcp_count(b, cnt)}")
    m2 = b.reg("f32")
    b.op(f"mov.f32 {m2}, 0f00000000")
    for v, pr in zip(values(), preds, strict=True):
        d = b.reg("f32")
        b.op(f"sub.f32 {d}, {v}, {mean}")
        guard = "" if pr is None else f"@{pr} "
        b.op(f"{guard}fma.rn.f32 {m2}, {d}, {d}, {m2}")
    chan_merge(b, acc, (cnt, mean, m2))


# ---------------------------------------------------------------- across the lanes of a warp


def butterfly(
    b: Builder, offsets: Iterable[int], values: list[tuple[str, str]], pairs: list[tuple[str, str]]
) -> None:
    """Every lane ends with the combination of all lanes' values over `offsets` (see
    `butterfly_offsets`): `values` are (op of `COMBINE`, register), `pairs` online (m, s)
    pairs. At each offset the plain values go first, then the pairs."""
    for off in offsets:
        for op, a in values:
            o = b.reg("f32")
            b.op(f"shfl.sync.bfly.b32 {o}, {a}, {off}, 31, -1")
            b.op(f"{COMBINE[op]} {a}, {a}, {o}")
        for m, s in pairs:
            mo, so = b.reg("f32"), b.reg("f32")
            b.op(f"shfl.sync.bfly.b32 {mo}, {m}, {off}, 31, -1")
            b.op(f"shfl.sync.bfly.b32 {so}, {s}, {off}, 31, -1")
            pair_combine(b, m, s, mo, so)


def moments_butterfly(b: Builder, offsets: Iterable[int], lane: str, accs: list) -> None:
    """Every lane ends with the (count, mean, M2) triples of `accs` merged over `offsets`
    (`chan_merge`). `lane` holds the lane index (%laneid or tid & 31): both lanes of a pair
    merge (lower lane, upper lane) in that order, so they agree to the last bit."""
    for off in offsets:
        up = b.reg("pred")
        bit = b.reg("b32")
        b.op(f"and.b32 {bit}, {lane}, {off}")
        b.op(f"setp.ne.u32 {up}, {bit}, 0")
        for acc in accs:
            other = []
            for r in acc:
                o = b.reg("f32")
                b.op(f"shfl.sync.bfly.b32 {o}, {r}, {off}, 31, -1")
                other.append(o)
            lo, hi = [], []
            for r, o in zip(acc, other, strict=True):
                a_, c_ = b.reg("f32"), b.reg("f32")
                b.op(f"selp.f32 {a_}, {o}, {r}, {up}")
                b.op(f"selp.f32 {c_}, {r}, {o}, {up}")
                lo.append(a_)
                hi.append(c_)
            chan_merge(b, lo, hi)
            for r, v in zip(acc, lo, strict=True):
                b.op(f"mov.f32 {r}, {v}")


# ---------------------------------------------------------------- across the warps of a group


@dataclass(frozen=True)
class WarpSlots:
    """Where the W warps of a thread group meet in shared memory: slots of W f32 words each,
    [slot][warp], from `group` (a b32 shared address: the group's first slot's word of warp 0);
    `write` is the address of this thread's warp's word in slot 0 (group + 4 * warp); `lane0`
    the predicate of the warp's lane 0, which writes; `bar` the barrier instruction every warp
    of the group reaches ("bar.sync 0", or a named "bar.sync %r, threads"). A caller gives
    every reduction stage its own slots (`first_slot`), so that no thread overwrites a word
    another may still be reading."""

    group: str
    write: str
    lane0: str
    warps: int
    bar: str

    def offset(self, slot: int) -> int:
        """Bytes from `group` (or `write`) to the slot's word of warp 0 (of this warp)."""
        return slot * self.warps * 4


def across_warps(
    b: Builder,
    sm: WarpSlots,
    first_slot: int,
    values: list[tuple[str, str]],
    pairs: list[tuple[str, str]],
) -> None:
    """Every thread of the group ends with the group's value of each of `values` ((op, register),
    a warp's value in each of its lanes: after `butterfly`) and of each online pair (m, s):
    slots first_slot .. + len(values) + len(pairs) - 1. One barrier for the plain values and
    the pairs' maxima; two more for the pairs' sums (`pairs_across_warps`)."""
    for idx, (_op, a) in enumerate(values):
        b.op(f"@{sm.lane0} st.shared.f32 [{sm.write}+{sm.offset(first_slot + idx)}], {a}")
    for pidx, (m, _s) in enumerate(pairs):
        off = sm.offset(first_slot + len(values) + pidx)
        b.op(f"@{sm.lane0} st.shared.f32 [{sm.write}+{off}], {m}")
    b.op(sm.bar)
    for idx, (op, a) in enumerate(values):
        base = sm.offset(first_slot + idx)
        b.op(f"ld.shared.f32 {a}, [{sm.group}+{base}]")
        for w in range(1, sm.warps):
            o = b.reg("f32")
            b.op(f"ld.shared.f32 {o}, [{sm.group}+{base + 4 * w}]")
            b.op(f"{COMBINE[op]} {a}, {a}, {o}")
    pairs_across_warps(b, sm, first_slot + len(values), pairs)


def pairs_across_warps(b: Builder, sm: WarpSlots, first_slot: int, pairs) -> None:
    """Online pairs across the warps, the warps' maxima already in slots first_slot.. behind a
    barrier (`across_warps`): each thread takes the group's max, rescales its sum to it, and the
    sums go through a second round (a barrier later, so that every thread has read the maxima
    before any is overwritten), so each slot stays one word."""
    if not pairs:
        return
    for pidx, (m, s) in enumerate(pairs):
        base = sm.offset(first_slot + pidx)
        rowmax = b.reg("f32")
        b.op(f"ld.shared.f32 {rowmax}, [{sm.group}+{base}]")
        for w in range(1, sm.warps):
            o = b.reg("f32")
            b.op(f"ld.shared.f32 {o}, [{sm.group}+{base + 4 * w}]")
            b.op(f"max.f32 {rowmax}, {rowmax}, {o}")
        b.op(f"mul.f32 {s}, {s}, {exp_below(b, m, safe_max(b, rowmax))}")
        b.op(f"mov.f32 {m}, {rowmax}")
    b.op(sm.bar)
    for pidx, (_m, s) in enumerate(pairs):
        base = sm.offset(first_slot + pidx)
        b.op(f"@{sm.lane0} st.shared.f32 [{sm.write}+{base}], {s}")
    b.op(sm.bar)
    for pidx, (_m, s) in enumerate(pairs):
        base = sm.offset(first_slot + pidx)
        b.op(f"ld.shared.f32 {s}, [{sm.group}+{base}]")
        for w in range(1, sm.warps):
            o = b.reg("f32")
            b.op(f"ld.shared.f32 {o}, [{sm.group}+{base + 4 * w}]")
            b.op(f"add.f32 {s}, {s}, {o}")


def moments_across_warps(b: Builder, sm: WarpSlots, first_slot: int, accs: list) -> None:
    """Every thread of the group ends with the group's (count, mean, M2) triples, a warp's in
    each of its lanes (after `moments_butterfly`): three slots per triple from first_slot, one
    barrier, then the warps' triples merged in warp order (`chan_merge`)."""
    for i, acc in enumerate(accs):
        for c, r in enumerate(acc):
            off = sm.offset(first_slot + 3 * i + c)
            b.op(f"@{sm.lane0} st.shared.f32 [{sm.write}+{off}], {r}")
    b.op(sm.bar)
    for i, acc in enumerate(accs):
        bases = [sm.offset(first_slot + 3 * i + c) for c in range(3)]
        for r, base in zip(acc, bases, strict=True):
            b.op(f"ld.shared.f32 {r}, [{sm.group}+{base}]")
        for w in range(1, sm.warps):
            other = [b.reg("f32") for _ in range(3)]
            for r, base in zip(other, bases, strict=True):
                b.op(f"ld.shared.f32 {r}, [{sm.group}+{base + 4 * w}]")
            chan_merge(b, acc, other)


# ---------------------------------------------------------------- across the blocks of a cluster


def cluster_barrier(b: Builder) -> None:
    """Every thread of every block of the cluster arrives (release) and waits (acquire)."""
    b.op("barrier.cluster.arrive.release.aligned")
    b.op("barrier.cluster.wait.acquire.aligned")


@dataclass(frozen=True)
class ClusterSlots:
    """Where the blocks of a cluster meet: `symbol`, a .shared array of two f32 words per slot
    (.align 8) in every block, written by the thread under `writer` (one per block); `blocks`
    the cluster's size (`.reqnctapercluster`)."""

    symbol: str
    writer: str
    blocks: int


def across_cluster(
    b: Builder,
    cl: ClusterSlots,
    first_slot: int,
    values: list[tuple[str, str]],
    pairs: list[tuple[str, str]],
) -> None:
    """Every thread holds its block's value of each of `values` ((op, register)) and each online
    pair (m, s), and ends with the cluster's: the writer of each block publishes them in its
    slots from first_slot (a value in the first word of its slot, a pair in both); after a
    cluster barrier every thread reads all the blocks' slots through distributed shared memory
    (mapa) and combines them in rank order, so every block ends with the same bits. A caller
    gives every stage its own slots, and keeps every block of the cluster alive until the others
    are done reading (a `cluster_barrier` before exit)."""
    b.comment(f"across the cluster: {cl.blocks} blocks combine through distributed shared memory")
    base = b.reg("b32")
    b.op(f"mov.u32 {base}, {cl.symbol}")
    slots = [(a, None) for _op, a in values] + list(pairs)
    for i, (x, y) in enumerate(slots):
        off = (first_slot + i) * 8
        b.op(f"@{cl.writer} st.shared.f32 [{base}+{off}], {x}")
        if y is not None:
            b.op(f"@{cl.writer} st.shared.f32 [{base}+{off + 4}], {y}")
    cluster_barrier(b)
    remote = []
    for rank in range(cl.blocks):
        r = b.reg("b32")
        b.op(f"mapa.shared::cluster.u32 {r}, {base}, {rank}")
        remote.append(r)
    for i, (op, a) in enumerate(values):
        off = (first_slot + i) * 8
        b.op(f"ld.shared::cluster.f32 {a}, [{remote[0]}+{off}]")
        for rank in range(1, cl.blocks):
            o = b.reg("f32")
            b.op(f"ld.shared::cluster.f32 {o}, [{remote[rank]}+{off}]")
            b.op(f"{COMBINE[op]} {a}, {a}, {o}")
    for j, (m, s) in enumerate(pairs):
        off = (first_slot + len(values) + j) * 8
        b.op(f"ld.shared::cluster.f32 {m}, [{remote[0]}+{off}]")
        b.op(f"ld.shared::cluster.f32 {s}, [{remote[0]}+{off + 4}]")
        for rank in range(1, cl.blocks):
            mo, so = b.reg("f32"), b.reg("f32")
            b.op(f"ld.shared::cluster.f32 {mo}, [{remote[rank]}+{off}]")
            b.op(f"ld.shared::cluster.f32 {so}, [{remote[rank]}+{off + 4}]")
            pair_combine(b, m, s, mo, so)
