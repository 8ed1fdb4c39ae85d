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

Each instruction is translated once per kernel into a small Python function (`Kernel.ops`), so
that running it is one call: f32 values are held as their bit patterns and computed in Python
floats (a sum, product, quotient, square root or fused multiply-add of f32 values rounded once
to f32 is the IEEE f32 result). Small shapes only: every thread still runs one instruction at a
time.
"""

from __future__ import annotations

import math
import re
import struct

import numpy as np

from factory.agents.ptxedit import split_operands
from factory.spec import eval_dim_expr

# ---------------------------------------------------------------- values

_U32 = struct.Struct("<I")
_F32 = struct.Struct("<f")
_U16 = struct.Struct("<H")
_F16 = struct.Struct("<e")
_INF, _NINF = 0x7F800000, 0xFF800000


def _f(bits: int) -> float:
    """The f32 of these bits, as a Python float (exactly)."""
    return _F32.unpack(_U32.pack(bits & 0xFFFFFFFF))[0]


def _b(x: float) -> int:
    """The bits of the f32 nearest x (ties to even; past the largest f32, infinity)."""
    try:
        return _U32.unpack(_F32.pack(x))[0]
    except OverflowError:
        return _INF if x > 0 else _NINF


def _bf16_bits(x: float) -> int:
    return _bf16_of(_b(x))


def _bf16_of(b: int) -> int:
    """The bf16 nearest the f32 of bits b (ties to even; a NaN is the canonical one)."""
    b &= 0xFFFFFFFF
    if (b & 0x7FFFFFFF) > 0x7F800000:
        return 0x7FC0
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF


def _f16_bits(x: float) -> int:
    try:
        return _U16.unpack(_F16.pack(x))[0]
    except OverflowError:
        return 0x7C00 if x > 0 else 0xFC00


def _from_f16(bits: int) -> float:
    return _F16.unpack(_U16.pack(bits & 0xFFFF))[0]


# inline forms of _f and _b for the translated instructions (a call less each)
_fu, _up, _bu, _fp = _F32.unpack, _U32.pack, _U32.unpack, _F32.pack
_FMAX = 3.4028234663852886e38  # the largest f32: nothing up to it overflows when packed


def _fx(tok_expr: str) -> str:
    """The expression for the f32 (a Python float) of bits given by an expression."""
    return f"_fu(_up({tok_expr} & 0xFFFFFFFF))[0]"


def _bx(dst: str, value: str) -> list[str]:
    """Statements storing the bits of the f32 nearest `value` into register `dst`."""
    return [f"v = {value}", f"r[{dst}] = _bu(_fp(v))[0] if -_FMAX <= v <= _FMAX else _b(v)"]


WIDTH = {"8": 0xFF, "16": 0xFFFF, "32": 0xFFFFFFFF, "64": 0xFFFFFFFFFFFFFFFF}
_M32, _M64 = WIDTH["32"], WIDTH["64"]


def _width(t: str) -> int:
    return WIDTH[re.sub(r"\D", "", t) or "32"]


def _signed(v: int, bits: int) -> int:
    return v - (1 << bits) if v >> (bits - 1) & 1 else v


def _rcp(x: float) -> float:
    return 1.0 / x if x else math.copysign(math.inf, x)


def _sqrt(x: float) -> float:
    return math.sqrt(x) if x >= 0 or x != x else math.nan


def _rsqrt(x: float) -> float:
    if x == 0:
        return math.copysign(math.inf, x)
    return 1.0 / math.sqrt(x) if x > 0 or x != x else math.nan


def _ex2(x: float) -> float:
    try:
        return math.exp2(x)
    except OverflowError:
        return math.inf


def _lg2(x: float) -> float:
    if x > 0:
        return math.log2(x)
    if x == 0:
        return -math.inf
    return math.nan  # negative or NaN


_UNARY = {
    "neg": "-x",
    "abs": "abs(x)",
    "rcp": "_rcp(x)",
    "sqrt": "_sqrt(x)",
    "rsqrt": "_rsqrt(x)",
    "ex2": "_ex2(x)",
    "lg2": "_lg2(x)",
    "tanh": "math.tanh(x)",
}


def _fmax(x: float, y: float) -> float:
    return y if x != x else x if y != y else max(x, y)


def _fmin(x: float, y: float) -> float:
    return y if x != x else x if y != y else min(x, y)


def _fma(x: float, y: float, z: float) -> float:
    return x * y + z  # the f64 product of two f32 is exact; one f64 rounding, then one to f32


def _copysign(x: float, y: float) -> float:  # copysign d, a, b: |b| with the sign of a
    return math.copysign(y, x)


def _max16(typ: str, want_max: bool, x: int, y: int) -> int:
    """max/min of two 16-bit lanes each; the larger (smaller) one is returned as it is, NaN only
    if both are."""
    v = 0
    for sh in (0, 16):
        hx, hy = (x >> sh) & 0xFFFF, (y >> sh) & 0xFFFF
        if typ == "bf16x2":
            fx, fy = _f(hx << 16), _f(hy << 16)
        else:
            fx, fy = _from_f16(hx), _from_f16(hy)
        if fx != fx:
            h = hy
        elif fy != fy:
            h = hx
        else:
            h = hx if (fx >= fy if want_max else fx <= fy) else hy
        v |= h << sh
    return v


def _prmt(a: int, b: int, sel: int) -> int:
    """Bytes of {b, a} (a's are 0-3), picked by the selector's four low nibbles; a nibble's top
    bit (replicate the sign) is not used by the emitter."""
    src = (a & 0xFFFFFFFF) | ((b & 0xFFFFFFFF) << 32)
    v = 0
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        assert nib < 8, f"prmt sign replication is not modelled: {sel:#x}"
        v |= ((src >> (8 * nib)) & 0xFF) << (8 * i)
    return v


# ---------------------------------------------------------------- parsing

_LINE = re.compile(r"^\s*(@!?%\w+\s+)?([\w.:]+)\s*(.*?);\s*$")

# mapa gives a shared::cluster address: the owning block's rank above the block-local offset.
_RANK_SHIFT = 24
_RANK_MASK = (1 << _RANK_SHIFT) - 1
_POLICY = 0x5EED_0000_CAC4E  # what createpolicy leaves in its register, checked where it is used

# what Thread.run does with an instruction: compute it, or hand it to the scheduler, or jump
BLOCK, SHFL, BAR, CBAR, SKIP, BRA, RET = range(7)

_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!=", "neu": "!="}
_LOAD_BYTES = {"b16": 2, "u16": 2, "b32": 4, "f32": 4, "s32": 4, "s64": 8, "u64": 8}
_STORE_BYTES = {"b16": 2, "b32": 4, "f32": 4}


class Kernel:
    """An entry's body, parsed: `code` (predicate, negated, opcode, operands) per instruction
    and `ops` (predicate, negated, kind, function or jump target, operands) to run it."""

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
        self.ops = _translate(self)


# ---------------------------------------------------------------- translation


def _expr(k: Kernel, tok: str, bits: int = 32) -> str:
    """A Python expression for an operand's value in `r` (the thread's registers)."""
    if tok.startswith("%"):
        return f"r[{tok!r}]"  # special registers (%tid.x, ...) are registers of each thread
    if tok.startswith("0f"):
        return str(int(tok[2:], 16))
    if tok == "red_smem":
        return "0"
    if tok == "cl_smem":
        return str(k.cluster_smem)
    return str(int(tok, 0) & ((1 << bits) - 1))


def _addr(k: Kernel, tok: str) -> str:
    inner = tok.strip("[]")
    if "+" in inner:
        base, off = inner.split("+")
        return f"({_expr(k, base, 64)} + {int(off)})"
    return _expr(k, inner, 64)


def _vector(tok: str) -> list[str]:
    return [x.strip() for x in tok.strip("{}").split(",")]


def _body(k: Kernel, op: str, a: list) -> list[str]:  # noqa: C901 - one table, top to bottom
    """The statements that compute one plain instruction over `r` and `th` (the Thread)."""
    parts = op.split(".")
    base, typ = parts[0], parts[-1]

    def e(tok, bits=32):
        return _expr(k, tok, bits)

    d = repr(a[0]) if a else ""
    if base == "ld" and parts[1] == "param":
        return [f"r[{d}] = th.params[{a[1].strip('[]')!r}]"]
    if base == "cvta":
        return [f"r[{d}] = {e(a[1], 64)}"]
    if base == "mov":
        if a[0].startswith("{"):
            lo, hi = _vector(a[0])
            return [f"v = {e(a[1])}", f"r[{lo!r}] = v & 0xFFFF", f"r[{hi!r}] = (v >> 16) & 0xFFFF"]
        if a[1].startswith("{"):
            lo, hi = _vector(a[1])
            return [f"r[{d}] = ({e(lo)} & 0xFFFF) | (({e(hi)} & 0xFFFF) << 16)"]
        return [f"r[{d}] = {e(a[1], 64 if typ in ('b64', 'u64') else 32)}"]
    if base == "mapa":
        return [
            f"rank = {e(a[2])}",
            "assert 0 <= rank < len(th.cluster_smem), f'mapa to rank {rank} outside the cluster'",
            f"r[{d}] = ((rank + 1) << {_RANK_SHIFT}) | {e(a[1])}",
        ]
    if base == "fence":
        return ["pass"]  # threads run one at a time here, each access done before the next
    if base == "createpolicy":
        return [f"r[{d}] = {_POLICY}"]  # an L2 cache policy, read by cache_hint loads and stores
    if base in ("ld", "st"):
        out = []
        if len(a) == 3:  # the cache policy operand
            assert "L2::cache_hint" in op, f"bad policy: {op} {a}"
            out.append(f"assert r[{a[2]!r}] == {_POLICY}, {f'bad policy: {op} {a}'!r}")
        return out + (_load(k, parts, a) if base == "ld" else _store(k, parts, a))
    if typ == "f32" and base in ("add", "sub", "mul", "max", "min", "div", "fma", "copysign"):
        x, y = _fx(e(a[1])), _fx(e(a[2]))
        v = {
            "add": f"{x} + {y}",
            "sub": f"{x} - {y}",
            "mul": f"{x} * {y}",
            "div": f"_div({x}, {y})",
            "max": f"_fmax({x}, {y})",
            "min": f"_fmin({x}, {y})",
            "fma": f"_fma({x}, {y}, {_fx(e(a[3]))})" if base == "fma" else "",
            "copysign": f"_copysign({x}, {y})",
        }[base]
        return _bx(d, v)
    if typ == "f32" and base in _UNARY:
        return [f"x = {_fx(e(a[1]))}", *_bx(d, _UNARY[base])]
    if typ in ("bf16x2", "f16x2") and base in ("max", "min"):
        return [f"r[{d}] = _max16({typ!r}, {base == 'max'}, {e(a[1])}, {e(a[2])})"]
    if base == "selp":
        return [f"r[{d}] = {e(a[1])} if r[{a[3]!r}] else {e(a[2])}"]
    if base == "setp":
        return _compare(k, a[0], parts[1], parts[2], a[1], a[2])
    if base == "and" and typ == "pred":
        return [f"r[{d}] = bool(r[{a[1]!r}]) and bool(r[{a[2]!r}])"]
    if base == "not" and typ == "pred":
        return [f"r[{d}] = not r[{a[1]!r}]"]
    if base in ("add", "sub", "mul", "mad", "shl", "shr", "and", "or", "xor", "min", "max"):
        bits = 64 if typ[-2:] == "64" else 32
        x, y = e(a[1], bits), e(a[2], bits)
        mask = (1 << bits) - 1
        if base == "mul" and parts[1] == "wide":
            v, mask = f"({x} & 0xFFFFFFFF) * ({y} & 0xFFFFFFFF)", _M64
        elif base in ("min", "max"):
            assert typ[0] == "u", f"signed {op} is not modelled"
            v = f"{base}({x}, {y})"
        elif base == "shr" and typ[0] == "s":
            v = f"_signed({x}, {bits}) >> {y}"
        elif base == "mad":
            v = f"{x} * {y} + {e(a[3], bits)}"
        else:
            sym = {"add": "+", "sub": "-", "mul": "*", "shl": "<<", "shr": ">>", "and": "&"}
            v = f"{x} {(sym | {'xor': '^', 'or': '|'})[base]} {y}"
        return [f"r[{d}] = ({v}) & {mask}"]
    if base == "cvt":
        return _convert(k, parts, a)
    if op == "prmt.b32":
        return [f"r[{d}] = _prmt({e(a[1])}, {e(a[2])}, {e(a[3])})"]
    raise NotImplementedError(op)


def _div(x: float, y: float) -> float:
    if y:
        return x / y
    if x != x or x == 0:
        return math.nan
    return math.copysign(math.inf, x) * math.copysign(1.0, y)


def _compare(k: Kernel, dst: str, cmp: str, typ: str, x: str, y: str) -> list[str]:
    sym = _CMP[cmp]
    if typ == "f32":
        # with a NaN on either side, only the unordered comparisons hold
        nan = cmp in ("neu", "nan")
        return [
            f"a = {_fx(_expr(k, x))}",
            f"b = {_fx(_expr(k, y))}",
            f"r[{dst!r}] = {nan} if a != a or b != b else a {sym} b",
        ]
    assert cmp != "neu", f"setp.{cmp}.{typ} is not modelled"
    bits = int(typ[1:])
    vx, vy = _expr(k, x, bits), _expr(k, y, bits)
    if typ[0] == "s":
        vx, vy = f"_signed({vx}, {bits})", f"_signed({vy}, {bits})"
    return [f"r[{dst!r}] = {vx} {sym} {vy}"]


def _convert(k: Kernel, parts: list, a: list) -> list[str]:
    kinds = [p for p in parts[1:] if p not in ("rn", "ftz", "sat")]
    dst, src = kinds[0], kinds[1]
    d = repr(a[0])

    def e(tok, bits=32):
        return _expr(k, tok, bits)

    # (an f32's bits are those of its value: bf16 rounds the bits as they are)
    if dst == "bf16x2":
        return [f"r[{d}] = (_bf16_of({e(a[1])}) << 16) | _bf16_of({e(a[2])})"]
    if dst == "f16x2":
        return [f"r[{d}] = (_f16_bits(_f({e(a[1])})) << 16) | _f16_bits(_f({e(a[2])}))"]
    if dst == "bf16":
        return [f"r[{d}] = _bf16_of({e(a[1])})"]
    if dst == "f16":
        return [f"r[{d}] = _f16_bits(_f({e(a[1])}))"]
    if dst == "f32" and src == "bf16":
        return [f"r[{d}] = ({e(a[1])} & 0xFFFF) << 16"]
    if dst == "f32" and src == "f16":
        return [f"r[{d}] = _b(_from_f16({e(a[1])} & 0xFFFF))"]
    if dst == "f32":
        bits = int(src[1:])
        v = e(a[1], bits)
        if src[0] == "s":
            v = f"_signed({v}, {bits})"
        return [f"r[{d}] = _b(float(np.float32({v})))"]
    if dst in ("u32", "s32") and src in ("u64", "s64"):
        return [f"r[{d}] = {e(a[1], 64)} & {_M32}"]
    if dst in ("u64", "s64"):
        bits = int(src[1:])
        v = e(a[1], bits)
        if src[0] == "s":
            v = f"_signed({v}, {bits})"
        return [f"r[{d}] = {v} & {_M64}"]
    raise NotImplementedError(".".join(parts))


def _load(k: Kernel, parts: list, a: list) -> list[str]:
    space, typ = parts[1], parts[-1]
    n = _LOAD_BYTES[typ]
    if space == "shared::cluster":
        return [
            f"o = {_addr(k, a[1])}",
            f"owner = (o >> {_RANK_SHIFT}) - 1",
            "assert owner >= 0, 'a shared::cluster load from an address mapa did not make'",
            f"o &= {_RANK_MASK}",
            f"r[{a[0]!r}] = int.from_bytes(th.cluster_smem[owner][o : o + 4], 'little')",
        ]
    if space == "shared":
        return [
            f"o = {_addr(k, a[1])}",
            f"r[{a[0]!r}] = int.from_bytes(th.smem[o : o + 4], 'little')",
        ]
    vec = next((int(p[1]) for p in parts if p in ("v2", "v4")), 1)
    dsts = _vector(a[0])
    assert len(dsts) == vec
    out = [
        f"ad = {_addr(k, a[1])}",
        f"assert ad % {vec * n} == 0, f'misaligned {vec}x{n}-byte load at {{ad:#x}}'",
    ]
    if vec == 1:
        return out + [f"r[{dsts[0]!r}] = th.mem.read(ad, {n})"]
    return out + [
        f"v = th.mem.read(ad, {vec * n})",
        *(f"r[{x!r}] = (v >> {8 * n * i}) & {(1 << 8 * n) - 1}" for i, x in enumerate(dsts)),
    ]


def _store(k: Kernel, parts: list, a: list) -> list[str]:
    space, typ = parts[1], parts[-1]
    n = _STORE_BYTES[typ]
    if space == "shared":
        return [
            f"o = {_addr(k, a[0])}",
            f"th.smem[o : o + 4] = ({_expr(k, a[1])} & 0xFFFFFFFF).to_bytes(4, 'little')",
        ]
    vec = next((int(p[1]) for p in parts if p in ("v2", "v4")), 1)
    srcs = _vector(a[1])
    out = [f"ad = {_addr(k, a[0])}"]
    if vec > 1:
        out.append(f"assert ad % {vec * n} == 0, f'misaligned {vec}x{n}-byte store at {{ad:#x}}'")
    return out + [f"th.mem.write(ad + {i * n}, {n}, {_expr(k, s)})" for i, s in enumerate(srcs)]


def _raise(exc: Exception):
    raise exc


def _control(k: Kernel, op: str, a: list) -> tuple | None:
    """(kind, jump target) of an instruction that leaves a block, else None."""
    if op.startswith("shfl.sync"):
        return SHFL, None
    if op.startswith("bar.sync"):
        return BAR, None
    if op.startswith("barrier.cluster.arrive"):
        return CBAR, None  # the rendezvous; the matching wait is then a no-op
    if op.startswith("barrier.cluster.wait"):
        return SKIP, None
    if op.startswith("bra"):
        return BRA, k.labels[a[0]]
    if op == "ret":
        return RET, None
    return None


def _translate(k: Kernel) -> list:
    """What Thread.run executes, by instruction index: at the first instruction of each run of
    plain instructions that no branch enters (a block), (BLOCK, function, index after it, its
    length), the function computing them all over (registers, thread), each under its own
    predicate; at each control instruction (shfl, barriers, bra, ret) (predicate, negated,
    kind, jump target, operands). The blocks are compiled together; an instruction the
    interpreter does not model raises where it runs, not before."""
    code = k.code
    ctl = [_control(k, op, a) for _, _, op, a in code]
    entered = set(k.labels.values())
    ops: list = [None] * len(code)
    src, blocks, errors = [], [], []
    i = 0
    while i < len(code):
        if ctl[i] is not None:
            pred, neg, _, a = code[i]
            ops[i] = (pred, neg, ctl[i][0], ctl[i][1], a)
            i += 1
            continue
        start, lines = i, []
        while i < len(code) and ctl[i] is None and (i == start or i not in entered):
            pred, neg, op, a = code[i]
            try:
                body = _body(k, op, a)
            except Exception as exc:  # noqa: BLE001 - raised if the instruction ever runs
                body = [f"_raise(_errors[{len(errors)}])"]
                errors.append(exc)
            pad = "    "
            if pred is not None:
                lines.append(f"    if {'not ' if neg else ''}r[{pred!r}]:")
                pad = "        "
            lines += [pad + line for line in body]
            i += 1
        blocks.append((start, i))
        src.append(f"def _blk{start}(r, th):\n" + "\n".join(lines) + "\n")
    space = {n: v for n, v in globals().items() if n.startswith("_") and not n.startswith("__")}
    space |= {"math": math, "np": np, "_errors": errors}
    exec(compile("\n".join(src), "<ptxsim>", "exec"), space)  # noqa: S102 - our own translation
    for start, end in blocks:
        ops[start] = (BLOCK, space[f"_blk{start}"], end, end - start)
    return ops


# ---------------------------------------------------------------- memory


class Memory:
    BASE = 0x10000

    def __init__(self):
        self.buf = bytearray()
        self.allocs: dict[str, tuple[int, int]] = {}
        self._spans: list[tuple[int, int]] = []

    def alloc(self, name: str, data: bytes, skew: int = 0) -> int:
        """`data` at a 256-byte boundary, or `skew` bytes past one."""
        off = (len(self.buf) + 255) // 256 * 256 + skew
        self.buf.extend(b"\0" * (off - len(self.buf)))
        addr = self.BASE + off
        self.buf.extend(data)
        self.buf.extend(b"\xa5" * 256)  # a guard: reading it gives garbage, writing is caught
        self.allocs[name] = (addr, len(data))
        self._spans.append((addr, addr + len(data)))
        return addr

    def _check(self, addr: int, n: int, write: bool):
        for a, end in self._spans:
            if a <= addr and addr + n <= end:
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


class Thread:
    def __init__(
        self, k: Kernel, tid: int, ctaid: int, nctaid: int, ntid: int, params, mem, smem,
        rank: int = 0, cluster_smem: list | None = None,
    ):  # fmt: skip
        self.k, self.tid, self.ctaid, self.nctaid, self.ntid = k, tid, ctaid, nctaid, ntid
        self.params, self.mem, self.smem = params, mem, smem
        self.rank, self.cluster_smem = rank, cluster_smem or [smem]
        self.r: dict[str, object] = {
            "%tid.x": tid,
            "%ctaid.x": ctaid,
            "%nctaid.x": nctaid,
            "%cluster_ctarank": rank,
        }
        self.pc = 0
        self.done = False
        self.steps = 0
        self.taken: list[int] = []  # where each branch taken went: lanes that differ diverged

    def val(self, tok: str, bits: int = 32):
        if tok.startswith("%"):
            return self.r[tok]
        if tok.startswith("0f"):
            return int(tok[2:], 16)
        if tok == "red_smem":
            return 0
        if tok == "cl_smem":
            return self.k.cluster_smem
        return int(tok, 0) & ((1 << bits) - 1)

    def run(self):
        """Run until a shuffle or barrier (returns it) or the end (returns None)."""
        ops, r, pc, steps = self.k.ops, self.r, self.pc, self.steps
        end = len(ops)
        try:
            while pc < end:
                op = ops[pc]
                if op[0] == BLOCK:
                    op[1](r, self)
                    pc, steps = op[2], steps + op[3]
                    continue
                pred, neg, kind, target, a = op
                pc += 1
                steps += 1
                if pred is not None and bool(r[pred]) == neg:
                    continue
                if kind == BRA:
                    pc = target
                    self.taken.append(pc)
                elif kind == SHFL:
                    return ("shfl", a)
                elif kind == BAR:
                    return ("bar", a)
                elif kind == CBAR:
                    return ("cbar", a)
                elif kind == RET:
                    self.done = True
                    return None
            self.done = True
            return None
        finally:
            self.pc, self.steps = pc, steps


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


_KERNELS: dict[str, Kernel] = {}


def kernel_of(ptx: str) -> Kernel:
    """The parsed and translated kernel of this PTX text (kept for the process: the same
    kernel runs at several shapes)."""
    k = _KERNELS.get(ptx)
    if k is None:
        if len(_KERNELS) >= 256:
            _KERNELS.clear()
        k = _KERNELS[ptx] = Kernel(ptx)
    return k


def run_kernel(
    em,
    dims: dict,
    arrays: dict[str, np.ndarray],
    grid: int | None = None,
    skew: dict | None = None,
    warps: list | None = None,
):
    """Launch the emitted kernel over `arrays` (storage form; outputs pre-filled) at `dims`;
    `grid` overrides the launch's block count (every kernel strides over rows, so fewer blocks
    than rows makes each block loop, which is where a next-row prefetch does its work); `skew`
    places the named tensors that many bytes past a 256-byte boundary. `warps`, when given,
    receives each warp's lanes' branch traces (Thread.taken), a list of lists."""
    skew = skew or {}
    k = kernel_of(em.ptx)
    mem = Memory()
    params = {}
    for (_, pname), p in zip(k.params, em.params, strict=True):
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
