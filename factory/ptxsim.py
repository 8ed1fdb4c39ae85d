"""A CPU interpreter for the PTX subset the factory's emitters print: generated kernels run on
machines without a GPU (tests/factory/test_emit_sim.py checks them against factory.spec's float64
reference).

It executes every thread of every block (warps in lockstep at shuffles, blocks at barriers, the
blocks of a cluster together at its barrier), with IEEE f32 arithmetic, bf16/fp16 rounding to
nearest even, and a flat byte-addressed global memory whose tensors are bounds-checked (a guard
after each). Approximate instructions (ex2/lg2/tanh/rcp.approx) are computed exactly here; their
error bounds are the GPU tests' job. `run_kernel` launches an emitted kernel over numpy arrays;
`Thread.taken` records each thread's branches, so that callers can check that a warp's lanes
take one path.

Small shapes only: every thread runs one instruction at a time in Python.
"""

from __future__ import annotations

import re
import struct

import numpy as np

from factory.agents.ptxedit import split_operands
from factory.spec import eval_dim_expr

# ---------------------------------------------------------------- values


def _f(bits: int) -> np.float32:
    return np.frombuffer(struct.pack("<I", bits & 0xFFFFFFFF), dtype=np.float32)[0]


def _b(x) -> int:
    return struct.unpack("<I", np.float32(x).tobytes())[0]


def _bf16_bits(x: np.float32) -> int:
    b = _b(x)
    if (b & 0x7FFFFFFF) > 0x7F800000:
        return 0x7FC0
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF


def _f16_bits(x: np.float32) -> int:
    return int(np.float16(x).view(np.uint16))


def _from_f16(bits: int) -> np.float32:
    return np.float32(np.array([bits], dtype=np.uint16).view(np.float16)[0])


WIDTH = {"8": 0xFF, "16": 0xFFFF, "32": 0xFFFFFFFF, "64": 0xFFFFFFFFFFFFFFFF}


def _width(t: str) -> int:
    return WIDTH[re.sub(r"\D", "", t) or "32"]


def _signed(v: int, bits: int) -> int:
    return v - (1 << bits) if v >> (bits - 1) & 1 else v


# ---------------------------------------------------------------- parsing

_LINE = re.compile(r"^\s*(@!?%\w+\s+)?([\w.:]+)\s*(.*?);\s*$")


class Kernel:
    def __init__(self, ptx: str):
        start = ptx.index("\n{\n")  # the entry's body (comments above may hold braces)
        body = ptx[start + 3 : ptx.rindex("}")]
        head = ptx[:start]
        self.params = re.findall(r"\.param\s+\.(\w+)\s+(\w+)", head)
        self.shared_words = 0
        m = re.search(r"\.shared\s+\.align\s+\d+\s+\.f32\s+red_smem\[(\d+)\]", body)
        if m:
            self.shared_words = int(m.group(1))
        # A cluster row's published partials sit after red_smem in the block's shared memory.
        self.cluster_smem = 4 * self.shared_words
        m = re.search(r"\.shared\s+\.align\s+\d+\s+\.f32\s+cl_smem\[(\d+)\]", body)
        if m:
            self.shared_words += int(m.group(1))
        self.code: list[tuple] = []
        self.labels: dict[str, int] = {}
        for raw in body.splitlines():
            line = raw.split("//")[0].strip()
            if not line or line.startswith("."):
                continue
            if line.endswith(":"):
                self.labels[line[:-1]] = len(self.code)
                continue
            mm = _LINE.match(line)
            if not mm:
                raise ValueError(f"cannot parse {line!r}")
            pred, op, rest = mm.groups()
            neg = bool(pred and "!" in pred)
            pred = pred.strip().lstrip("@!") if pred else None
            self.code.append((pred, neg, op, split_operands(rest)))


# ---------------------------------------------------------------- memory


class Memory:
    BASE = 0x10000

    def __init__(self):
        self.buf = bytearray()
        self.allocs: dict[str, tuple[int, int]] = {}

    def alloc(self, name: str, data: bytes, skew: int = 0) -> int:
        """`data` at a 256-byte boundary, or `skew` bytes past one."""
        off = (len(self.buf) + 255) // 256 * 256 + skew
        self.buf.extend(b"\0" * (off - len(self.buf)))
        addr = self.BASE + off
        self.buf.extend(data)
        self.buf.extend(b"\xa5" * 256)  # a guard: reading it gives garbage, writing is caught
        self.allocs[name] = (addr, len(data))
        return addr

    def _check(self, addr: int, n: int, write: bool):
        for name, (a, size) in self.allocs.items():
            if a <= addr and addr + n <= a + size:
                return
        raise AssertionError(
            f"{'write' if write else 'read'} of {n} bytes at {addr:#x} is out of bounds"
        )

    def read(self, addr: int, n: int) -> int:
        self._check(addr, n, False)
        o = addr - self.BASE
        return int.from_bytes(self.buf[o : o + n], "little")

    def write(self, addr: int, n: int, v: int):
        self._check(addr, n, True)
        o = addr - self.BASE
        self.buf[o : o + n] = (v & ((1 << (8 * n)) - 1)).to_bytes(n, "little")

    def get(self, name: str) -> bytes:
        a, n = self.allocs[name]
        return bytes(self.buf[a - self.BASE : a - self.BASE + n])


# ---------------------------------------------------------------- execution


# mapa gives a shared::cluster address: the owning block's rank above the block-local offset.
_RANK_SHIFT = 24
_POLICY = 0x5EED_0000_CAC4E  # what createpolicy leaves in its register, checked where it is used


class Thread:
    def __init__(
        self, k: Kernel, tid: int, ctaid: int, nctaid: int, ntid: int, params, mem, smem,
        rank: int = 0, cluster_smem: list | None = None,
    ):  # fmt: skip
        self.k, self.tid, self.ctaid, self.nctaid, self.ntid = k, tid, ctaid, nctaid, ntid
        self.params, self.mem, self.smem = params, mem, smem
        self.rank, self.cluster_smem = rank, cluster_smem or [smem]
        self.r: dict[str, object] = {}
        self.pc = 0
        self.done = False
        self.steps = 0
        self.taken: list[int] = []  # where each branch taken went: lanes that differ diverged

    def val(self, tok: str, bits: int = 32):
        if tok.startswith("%"):
            specials = {
                "%tid.x": self.tid,
                "%ctaid.x": self.ctaid,
                "%nctaid.x": self.nctaid,
                "%cluster_ctarank": self.rank,
            }
            if tok in specials:
                return specials[tok]
            return self.r[tok]
        if tok.startswith("0f"):
            return int(tok[2:], 16)
        if tok == "red_smem":
            return 0
        if tok == "cl_smem":
            return self.k.cluster_smem
        return int(tok, 0) & ((1 << bits) - 1)

    def addr(self, tok: str) -> int:
        inner = tok.strip("[]")
        if "+" in inner:
            base, off = inner.split("+")
            return self.val(base, 64) + int(off)
        return self.val(inner, 64)

    def run(self):
        """Run until a shuffle or barrier (returns it) or the end (returns None)."""
        code = self.k.code
        while True:
            if self.pc >= len(code):
                self.done = True
                return None
            pred, neg, op, a = code[self.pc]
            self.pc += 1
            self.steps += 1
            if pred is not None and bool(self.r[pred]) == neg:
                continue
            if op.startswith("shfl.sync"):
                return ("shfl", a)
            if op.startswith("bar.sync"):
                return ("bar", a)
            if op.startswith("barrier.cluster.arrive"):
                return ("cbar", a)  # the rendezvous; the matching wait is then a no-op
            if op.startswith("barrier.cluster.wait"):
                continue
            if op.startswith("bra"):
                self.pc = self.k.labels[a[0]]
                self.taken.append(self.pc)
                continue
            if op == "ret":
                self.done = True
                return None
            self.execute(op, a)

    def execute(self, op: str, a: list):  # noqa: C901 - one dispatch table, read top to bottom
        r, parts = self.r, op.split(".")
        base = parts[0]
        typ = parts[-1]
        if base == "ld" and parts[1] == "param":
            r[a[0]] = self.params[a[1].strip("[]")]
        elif base == "cvta":
            r[a[0]] = self.val(a[1], 64)
        elif base == "mov":
            if a[0].startswith("{"):
                lo, hi = (x.strip() for x in a[0].strip("{}").split(","))
                v = self.val(a[1])
                r[lo], r[hi] = v & 0xFFFF, (v >> 16) & 0xFFFF
            elif a[1].startswith("{"):
                lo, hi = (x.strip() for x in a[1].strip("{}").split(","))
                r[a[0]] = (self.val(lo) & 0xFFFF) | ((self.val(hi) & 0xFFFF) << 16)
            else:
                r[a[0]] = self.val(a[1], 64 if typ in ("b64", "u64") else 32)
        elif base == "mapa":
            rank = self.val(a[2])
            assert 0 <= rank < len(self.cluster_smem), f"mapa to rank {rank} outside the cluster"
            r[a[0]] = ((rank + 1) << _RANK_SHIFT) | self.val(a[1])
        elif base == "fence":
            pass  # threads run one at a time here, each access done before the next: in order
        elif base == "createpolicy":
            r[a[0]] = _POLICY  # an L2 cache policy: only loads and stores with cache_hint read it
        elif base in ("ld", "st"):
            if len(a) == 3:  # the cache policy operand
                assert "L2::cache_hint" in op and self.r[a[2]] == _POLICY, f"bad policy: {op} {a}"
            (self._load if base == "ld" else self._store)(parts, a)
        elif typ == "f32" and base in ("add", "sub", "mul", "max", "min", "div", "fma", "copysign"):
            x = _f(self.val(a[1]))
            y = _f(self.val(a[2]))
            with np.errstate(all="ignore"):
                if base == "add":
                    v = x + y
                elif base == "sub":
                    v = x - y
                elif base == "mul":
                    v = x * y
                elif base == "div":
                    v = x / y
                elif base == "max":
                    v = y if np.isnan(x) else x if np.isnan(y) else max(x, y)
                elif base == "min":
                    v = y if np.isnan(x) else x if np.isnan(y) else min(x, y)
                elif base == "fma":
                    v = np.float32(np.float64(x) * np.float64(y) + np.float64(_f(self.val(a[3]))))
                else:  # copysign d, a, b: |b| with the sign of a
                    v = np.copysign(y, x)
            r[a[0]] = _b(v)
        elif typ == "f32" and base in ("neg", "abs", "rcp", "sqrt", "rsqrt", "ex2", "lg2", "tanh"):
            x = np.float64(_f(self.val(a[1])))
            with np.errstate(all="ignore"):
                v = {
                    "neg": lambda: -x,
                    "abs": lambda: abs(x),
                    "rcp": lambda: 1.0 / x,
                    "sqrt": lambda: np.sqrt(x),
                    "rsqrt": lambda: 1.0 / np.sqrt(x),
                    "ex2": lambda: np.exp2(x),
                    "lg2": lambda: np.log2(x),
                    "tanh": lambda: np.tanh(x),
                }[base]()
            r[a[0]] = _b(np.float32(v))
        elif typ in ("bf16x2", "f16x2") and base in ("max", "min"):
            # two 16-bit lanes; the larger (smaller) one is returned as it is, NaN only if both
            x, y, v = self.val(a[1]), self.val(a[2]), 0
            for sh in (0, 16):
                hx, hy = (x >> sh) & 0xFFFF, (y >> sh) & 0xFFFF
                if typ == "bf16x2":
                    fx, fy = _f(hx << 16), _f(hy << 16)
                else:
                    fx, fy = (np.frombuffer(struct.pack("<H", h), np.float16)[0] for h in (hx, hy))
                if np.isnan(fx):
                    h = hy
                elif np.isnan(fy):
                    h = hx
                else:
                    h = hx if (fx >= fy if base == "max" else fx <= fy) else hy
                v |= h << sh
            r[a[0]] = v
        elif base == "selp":
            r[a[0]] = self.val(a[1]) if r[a[3]] else self.val(a[2])
        elif base == "setp":
            r[a[0]] = self._compare(parts[1], parts[2], a[1], a[2])
        elif base == "and" and typ == "pred":
            r[a[0]] = bool(r[a[1]]) and bool(r[a[2]])
        elif base == "not" and typ == "pred":
            r[a[0]] = not r[a[1]]
        elif base in ("add", "sub", "mul", "mad", "shl", "shr", "and", "or", "xor", "min", "max"):
            bits = 64 if typ[-2:] == "64" else 32
            x, y = self.val(a[1], bits), self.val(a[2], bits)
            mask = (1 << bits) - 1
            if base == "add":
                v = x + y
            elif base == "sub":
                v = x - y
            elif base == "mul" and parts[1] == "wide":
                v, mask = (x & 0xFFFFFFFF) * (y & 0xFFFFFFFF), WIDTH["64"]
            elif base == "mul":
                v = x * y
            elif base == "mad":
                v = x * y + self.val(a[3], bits)
            elif base == "shl":
                v = x << y
            elif base == "shr":
                v = _signed(x, bits) >> y if typ[0] == "s" else x >> y
            elif base == "and":
                v = x & y
            elif base == "xor":
                v = x ^ y
            elif base in ("min", "max"):
                assert typ[0] == "u", f"signed {op} is not modelled"
                v = min(x, y) if base == "min" else max(x, y)
            else:
                v = x | y
            r[a[0]] = v & mask
        elif base == "cvt":
            self._convert(parts, a)
        elif op == "prmt.b32":
            # bytes of {b, a} (a's are 0-3), picked by the selector's four low nibbles; a
            # nibble's top bit (replicate the sign) is not used by the emitter
            src = (self.val(a[1]) & 0xFFFFFFFF) | ((self.val(a[2]) & 0xFFFFFFFF) << 32)
            sel, v = self.val(a[3]), 0
            for i in range(4):
                nib = (sel >> (4 * i)) & 0xF
                assert nib < 8, f"prmt sign replication is not modelled: {sel:#x}"
                v |= ((src >> (8 * nib)) & 0xFF) << (8 * i)
            r[a[0]] = v
        else:
            raise NotImplementedError(op)

    def _compare(self, cmp: str, typ: str, x: str, y: str) -> bool:
        if typ == "f32":
            fx, fy = _f(self.val(x)), _f(self.val(y))
            if np.isnan(fx) or np.isnan(fy):
                return cmp in ("neu", "nan")
            return {
                "lt": fx < fy,
                "le": fx <= fy,
                "gt": fx > fy,
                "ge": fx >= fy,
                "eq": fx == fy,
                "ne": fx != fy,
                "neu": fx != fy,
            }[cmp]
        bits = int(typ[1:])
        vx, vy = self.val(x, bits), self.val(y, bits)
        if typ[0] == "s":
            vx, vy = _signed(vx, bits), _signed(vy, bits)
        return {
            "lt": vx < vy,
            "le": vx <= vy,
            "gt": vx > vy,
            "ge": vx >= vy,
            "eq": vx == vy,
            "ne": vx != vy,
        }[cmp]

    def _convert(self, parts: list, a: list):
        r = self.r
        kinds = [p for p in parts[1:] if p not in ("rn", "ftz", "sat")]
        dst, src = kinds[0], kinds[1]
        if dst == "bf16x2" or dst == "f16x2":
            enc = _bf16_bits if dst == "bf16x2" else _f16_bits
            hi, lo = enc(_f(self.val(a[1]))), enc(_f(self.val(a[2])))
            r[a[0]] = (hi << 16) | lo
        elif dst == "bf16":
            r[a[0]] = _bf16_bits(_f(self.val(a[1])))
        elif dst == "f16":
            r[a[0]] = _f16_bits(_f(self.val(a[1])))
        elif dst == "f32" and src == "bf16":
            r[a[0]] = (self.val(a[1]) & 0xFFFF) << 16
        elif dst == "f32" and src == "f16":
            r[a[0]] = _b(_from_f16(self.val(a[1]) & 0xFFFF))
        elif dst == "f32":
            bits = int(src[1:])
            v = self.val(a[1], bits)
            if src[0] == "s":
                v = _signed(v, bits)
            r[a[0]] = _b(np.float32(v))
        elif dst in ("u32", "s32") and src in ("u64", "s64"):
            r[a[0]] = self.val(a[1], 64) & WIDTH["32"]
        elif dst in ("u64", "s64"):
            bits = int(src[1:])
            v = self.val(a[1], bits)
            if src[0] == "s":
                v = _signed(v, bits)
            r[a[0]] = v & WIDTH["64"]
        else:
            raise NotImplementedError(".".join(parts))

    def _load(self, parts: list, a: list):
        space = parts[1]
        typ = parts[-1]
        n = {"b16": 2, "u16": 2, "b32": 4, "f32": 4, "s32": 4, "s64": 8, "u64": 8}[typ]
        if space == "shared::cluster":
            o = self.addr(a[1])
            owner = (o >> _RANK_SHIFT) - 1
            assert owner >= 0, "a shared::cluster load from an address mapa did not make"
            o &= (1 << _RANK_SHIFT) - 1
            self.r[a[0]] = int.from_bytes(self.cluster_smem[owner][o : o + 4], "little")
            return
        if space == "shared":
            o = self.addr(a[1])
            self.r[a[0]] = int.from_bytes(self.smem[o : o + 4], "little")
            return
        ad = self.addr(a[1])
        vec = next((int(p[1]) for p in parts if p in ("v2", "v4")), 1)
        dsts = [x.strip() for x in a[0].strip("{}").split(",")]
        assert len(dsts) == vec
        assert ad % (vec * n) == 0, f"misaligned {vec}x{n}-byte load at {ad:#x}"
        for i, d in enumerate(dsts):
            self.r[d] = self.mem.read(ad + i * n, n)

    def _store(self, parts: list, a: list):
        space = parts[1]
        typ = parts[-1]
        n = {"b16": 2, "b32": 4, "f32": 4}[typ]
        if space == "shared":
            o = self.addr(a[0])
            self.smem[o : o + 4] = (self.val(a[1]) & 0xFFFFFFFF).to_bytes(4, "little")
            return
        ad = self.addr(a[0])
        vec = next((int(p[1]) for p in parts if p in ("v2", "v4")), 1)
        srcs = [x.strip() for x in a[1].strip("{}").split(",")]
        if vec > 1:
            assert ad % (vec * n) == 0, f"misaligned {vec}x{n}-byte store at {ad:#x}"
        for i, s in enumerate(srcs):
            self.mem.write(ad + i * n, n, self.val(s))


def run_blocks(
    k: Kernel, ctaids: list[int], nctaid: int, ntid: int, params: dict, mem: Memory
) -> list[Thread]:
    """Run the blocks of one cluster together (one block when the kernel has no cluster):
    warps meet at shuffles, a block's threads at bar.sync, all the cluster's at its barrier."""
    smems = [bytearray(4 * max(k.shared_words, 1)) for _ in ctaids]
    threads = [
        Thread(k, t, c, nctaid, ntid, params, mem, smems[rank], rank, smems)
        for rank, c in enumerate(ctaids)
        for t in range(ntid)
    ]
    n = len(threads)
    waiting: dict[int, tuple] = {}
    live = set(range(n))
    runnable = list(range(n))
    while live:
        for t in runnable:
            ev = threads[t].run()
            if ev is None:
                live.discard(t)
            else:
                waiting[t] = ev
        runnable = []
        # Shuffles: a whole warp at the same instruction exchanges values.
        for w in range(0, n, 32):
            lanes = [t for t in range(w, min(w + 32, n)) if t in live]
            if lanes and all(t in waiting and waiting[t][0] == "shfl" for t in lanes):
                assert len(lanes) == 32, "a shuffle with a partial warp"
                vals = {t: threads[t].val(waiting[t][1][1]) for t in lanes}
                for t in lanes:
                    ops = waiting[t][1]
                    src = w + ((t - w) ^ int(ops[2]))
                    threads[t].r[ops[0]] = vals[src]
                    del waiting[t]
                    runnable.append(t)
        for first in range(0, n, ntid):
            block = [t for t in range(first, first + ntid) if t in live]
            if not runnable and block and all(waiting.get(t, ("",))[0] == "bar" for t in block):
                assert len(block) == ntid, "a block barrier that some threads left before"
                for t in block:
                    del waiting[t]
                runnable += block
        if not runnable and live and all(waiting.get(t, ("",))[0] == "cbar" for t in live):
            assert len(live) == n, "a cluster barrier that some threads left before"
            for t in live:
                del waiting[t]
            runnable = sorted(live)
        if not runnable and live:
            raise AssertionError(f"deadlock: {sorted(waiting.items())[:4]}")
    return threads


def run_kernel(
    em,
    dims: dict,
    arrays: dict[str, np.ndarray],
    grid: int | None = None,
    skew: dict = {},
    warps: list | None = None,
):
    """Launch the emitted kernel over `arrays` (storage form; outputs pre-filled) at `dims`;
    `grid` overrides the launch's block count (every kernel strides over rows, so fewer blocks
    than rows makes each block loop, which is where a next-row prefetch does its work); `skew`
    places the named tensors that many bytes past a 256-byte boundary. `warps`, when given,
    receives each warp's lanes' branch traces (Thread.taken), a list of lists."""
    k = Kernel(em.ptx)
    mem = Memory()
    params = {}
    for (ptype, pname), p in zip(k.params, em.params, strict=True):
        if p.kind == "tensor":
            data = np.ascontiguousarray(arrays[p.name]).tobytes()
            params[pname] = mem.alloc(p.name, data, skew.get(p.name, 0))
        else:
            params[pname] = int(dims[p.name])
    if grid is None:
        grid = int(eval_dim_expr(em.launch.grid[0], dims))
    size = em.launch.cluster[0] if em.launch.cluster else 1
    assert grid % size == 0, "the grid is not a multiple of the cluster"
    for c in range(0, grid, size):
        threads = run_blocks(k, list(range(c, c + size)), grid, em.launch.block[0], params, mem)
        if warps is not None:
            warps += [[t.taken for t in threads[w : w + 32]] for w in range(0, len(threads), 32)]
    return {name: mem.get(name) for name in arrays}
