"""AttentionSchedule: how the emitter tiles and pipelines one AttentionIR, the one validity
predicate, the space, the default and the seeds.

A CTA computes one (query tile of block_m rows, query head, batch entry): warpgroup 0 is the
producer (one thread issues the TMA loads: the Q tile once, then K and V tiles of block_n keys
into a ring of `stages` buffers), and block_m / 64 consumer warpgroups each own 64 query rows:
S = Q K^T by wgmma from shared memory, the score expression and masks, online softmax in
registers, O += P V by wgmma with P from registers. `pv_split`: O += P V is issued as D / 64
wgmmas of n64 (one 128-byte swizzle atom of V's columns each) instead of one of n = D (which
steps between atoms by the descriptor's leading byte offset). `overlap`: S of tile t is issued,
then P V of tile t - 1 behind it, and the softmax of tile t runs while the tensor cores work
(FlashAttention-3's intra-warpgroup overlap). `pingpong` (with `overlap` and two consumer
warpgroups): the two take turns issuing their products (two named barriers pass the turn), so
one's softmax runs while the other's wgmmas use the tensor cores.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

from factory.families.attention.ir import AttentionIR, dim_value

SMEM_LIMIT = 227 * 1024
REGS_PER_SM = 65536
PRODUCER_REGS = 40  # GPU-verified (round 2); FA3 uses 24 with consumers at 240
MAX_CONSUMER_REGS = 240
# Extra registers a consumer thread holds beside its fragments (indices, row state, addresses):
# with setmaxnreg honoured, 128 x 176 tiles with the overlap at head dim 128 (196 fragment
# registers) compile without spills at 232 for plain, ALiBi and window (ptxas 13.0; the soft
# cap and the document mask spill a little there, and not at 240 with a 24-register producer).
OVERHEAD_REGS = 36
# Whether the kernels are compiled by a compiler that honours setmaxnreg (ptxas on the PTX as a
# whole program, wholeprog.py): `whole_program()`. By default the GPU worker compiles with
# nvJitLink, which ignores it, so the space keeps only schedules that fit the launch register
# count (fits_relocatable); with PTXF_WHOLE_PROGRAM=1 the worker compiles such PTX with ptxas
# and the space admits every valid schedule. None here: the setting decides, read at each use;
# True or False overrides it (a test, or a bench that compiles with ptxas itself).
WHOLE_PROGRAM: bool | None = None

OPTIONS: dict[str, tuple] = {
    "block_m": (128, 64),
    "block_n": (128, 64),
    "stages": (2, 3, 4),
    "pv_split": (False, True),
    "overlap": (False, True),
    "pingpong": (False, True),
}
LAYOUT_FIELDS = ("block_m", "block_n", "stages")
# Key tiles the emitter renders but the search does not enumerate: 176 (FA3's non-causal width
# at head dim 128) compiles clean under ptxas as a whole program, and was never run on a GPU.
EXTRA_BLOCK_N = (176,)


@dataclass(frozen=True)
class AttentionSchedule:
    block_m: int = 128  # query rows per CTA: 64 per consumer warpgroup
    block_n: int = 128  # keys per KV tile (the wgmma N of S = Q K^T)
    stages: int = 2  # K+V buffers in the ring (K and V freed each on its own barrier)
    pv_split: bool = False
    overlap: bool = False  # the softmax of tile t beside P V of tile t - 1 (see emit.py)
    pingpong: bool = False  # the consumer warpgroups take turns on the tensor cores
    persistent: bool = False  # one CTA an SM walking the work tiles (not in OPTIONS yet)
    poly_tanh: bool = False  # tanh by a polynomial on tiles where it is accurate (not in OPTIONS)
    problem: str = ""  # "B,Hq,Hkv,S,Skv,D" dim names (features read the shape through it)
    family: str = "attention"

    @property
    def consumers(self) -> int:
        return self.block_m // 64

    def threads(self) -> int:
        return 128 * (1 + self.consumers)

    def consumer_regs(self) -> int:
        left = REGS_PER_SM - 128 * PRODUCER_REGS
        return min(MAX_CONSUMER_REGS, left // (128 * self.consumers) // 8 * 8)

    def smem_bytes(self, head_dim: int) -> int:
        q = self.block_m * head_dim * 2
        kv = self.stages * 2 * self.block_n * head_dim * 2
        # barriers: Q full (and empty), K and V full and empty; one 8-byte slot after them
        # (the document mask's pure tile range, emit.id_narrow)
        return 1024 + q + kv + 8 * (4 * self.stages + 3)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> AttentionSchedule:
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in known})

    def label(self) -> str:
        return (
            f"fa {self.block_m}x{self.block_n} s{self.stages} c{self.consumers}"
            + (" pv64" if self.pv_split else "")
            + (" ov" if self.overlap else "")
            + (" pp" if self.pingpong else "")
            + (" persistent" if self.persistent else "")
            + (" polytanh" if self.poly_tanh else "")
        )


def fragment_regs(s: AttentionSchedule, head_dim: int) -> int:
    """Registers of one consumer thread's fragments: S (block_n / 2 fp32), O (head_dim / 2
    fp32), P as bf16 pairs (block_n / 4). With `overlap` the next tile's probabilities wait in
    S's registers (fp32) until the last tile's P V is done, then are packed into P's."""
    return s.block_n // 2 + head_dim // 2 + s.block_n // 4


def entry_regs(s: AttentionSchedule) -> int:
    """The register count every thread gets at launch (the entry's .maxnreg): all a thread
    may use where setmaxnreg is ignored (nvJitLink's relocatable compile)."""
    return min(s.consumer_regs(), REGS_PER_SM // s.threads() // 8 * 8)


def fits_relocatable(ir: AttentionIR, s: AttentionSchedule) -> bool:
    """Whether a compile that ignores setmaxnreg (nvJitLink's relocatable one: every thread
    keeps the launch count) needs no spills. An empirical rule (nvJitLink 13.0, every
    schedule of the space compiled): the fragments, plus a second P's worth with `overlap`
    (what stays live beside the in-flight P V), within the launch count. is_valid assumes
    setmaxnreg is honoured (ptxas compiling the PTX as a whole program: wholeprog.py)."""
    extra = s.block_n // 4 if s.overlap else 0
    return fragment_regs(s, ir.head_dim) + extra <= entry_regs(s)


def whole_program() -> bool:
    """Whether the space may hold schedules that fit only where setmaxnreg is honoured:
    WHOLE_PROGRAM where set, else PTXF_WHOLE_PROGRAM (wholeprog.whole_program_enabled) now."""
    if WHOLE_PROGRAM is not None:
        return bool(WHOLE_PROGRAM)
    from factory.families.attention.wholeprog import whole_program_enabled

    return whole_program_enabled()


def is_valid(ir: AttentionIR, s: AttentionSchedule, dims: dict | None = None) -> str | None:
    """None when the emitter renders `ir` with `s` (at `dims`), else the reason."""
    if s.block_m not in OPTIONS["block_m"]:
        return f"block_m {s.block_m} not in {OPTIONS['block_m']}"
    if s.block_n not in OPTIONS["block_n"] + EXTRA_BLOCK_N:
        return f"block_n {s.block_n} not in {OPTIONS['block_n'] + EXTRA_BLOCK_N}"
    if s.stages not in OPTIONS["stages"]:
        return f"stages {s.stages} not in {OPTIONS['stages']}"
    if s.persistent and ir.id_matches:
        return "persistent CTAs do not narrow the tiles by ids (its scratch is the K ring)"
    if s.pingpong and not (s.overlap and s.consumers == 2):
        return "pingpong needs the overlapped loop and two consumer warpgroups"
    if s.smem_bytes(ir.head_dim) > SMEM_LIMIT:
        return f"shared memory {s.smem_bytes(ir.head_dim)} B over {SMEM_LIMIT}"
    need = fragment_regs(s, ir.head_dim) + OVERHEAD_REGS
    if need > s.consumer_regs():
        return f"about {need} registers a consumer thread, {s.consumer_regs()} available"
    if dims is not None:
        hq, hkv = dim_value(ir.hq, dims), dim_value(ir.hkv, dims)
        if hkv < 1 or hq % hkv:
            return f"{hq} query heads are not a multiple of {hkv} kv heads"
        if dim_value(ir.s, dims) < 1 or dim_value(ir.skv, dims) < 1:
            return "empty sequence"
        if dim_value(ir.b, dims) > 65535:
            return "batch above 65535 (grid z)"
        if hq > 65535:
            return "query heads above 65535 (grid y)"
    return None


def verdict(ir, s, dims=None) -> tuple[bool, str]:
    why = is_valid(ir, s, dims)
    return why is None, why or ""


def problem_text(ir: AttentionIR) -> str:
    """ "B,Hq,Hkv,S,Skv,D|lo:hi": the dims (names or sizes) and the mask's key band."""
    dims = ",".join(str(x) for x in (ir.b, ir.hq, ir.hkv, ir.s, ir.skv, ir.head_dim))
    return f"{dims}|{ir.band_lo}:{ir.band_hi}"


def candidates(ir: AttentionIR) -> list[AttentionSchedule]:
    names = list(OPTIONS)
    return [
        AttentionSchedule(problem=problem_text(ir), **dict(zip(names, vals, strict=True)))
        for vals in itertools.product(*(OPTIONS[n] for n in names))
    ]


def space(ir: AttentionIR, dims_list: list[dict]) -> list[AttentionSchedule]:
    whole = whole_program()
    return [
        s
        for s in candidates(ir)
        if is_valid(ir, s) is None
        and all(is_valid(ir, s, d) is None for d in dims_list)
        and (whole or fits_relocatable(ir, s))
    ]


def fits(ir, s, dims_list) -> bool:
    return is_valid(ir, s) is None and all(is_valid(ir, s, d) is None for d in dims_list)


def default_schedule(ir: AttentionIR, dims=None) -> AttentionSchedule:
    """128 x 128 tiles, two stages (a 128 head dim), three with a 64 head dim; the space's
    first otherwise."""
    dl = [] if dims is None else ([dims] if isinstance(dims, dict) else list(dims))
    stages = 2 if ir.head_dim == 128 else 3
    s = AttentionSchedule(stages=stages, problem=problem_text(ir))
    if fits(ir, s, dl):
        return s
    pool = space(ir, dl)
    if not pool:
        raise ValueError(f"no attention schedule renders {ir.name} at these shapes")
    return pool[0]


def seeds(ir: AttentionIR, dims: dict, limit: int = 6) -> list[AttentionSchedule]:
    """The default first, then the space ranked by the analytic estimate."""
    from factory.families.attention.features import estimate_us

    pool = space(ir, [dims])
    pool.sort(key=lambda s: estimate_us(s.to_dict(), dims))
    out = [default_schedule(ir, [dims])]
    for s in pool:
        if s not in out:
            out.append(s)
        if len(out) >= limit:
            break
    return out
