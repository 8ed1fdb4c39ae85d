"""PTX pieces shared by the Hopper (sm_90a) TMA + mbarrier + wgmma emitters (the matmul and
attention families): register helpers, the mbarrier ring's wait / advance / slot claim, the
thread-0 barrier initialisation, tensor-map prefetch, K-major 128-byte-swizzle wgmma
descriptors, and the entry's header lines.

`HopperKernel` is a mixin: the emitter sets `self.b` (a Builder) and `self.s` (a schedule with
`stages`) before calling these."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

PTX_VERSION = "8.5"
WGMMA_TYPE = {"bf16": "bf16", "fp16": "f16"}
# Descriptor bits of a K-major operand with 128-byte swizzle that do not depend on the address:
# LBO = 1 (unused by swizzled K-major layouts), SBO = 1024 >> 4 (8 rows of 128 bytes), mode 1.
DESC_CONST = (1 << 16) | (64 << 32) | (1 << 62)
# The 2D / 3D TMA tile load into shared memory that completes bytes on an mbarrier.
TMA_LOAD = "cp.async.bulk.tensor.{}d.shared::cluster.global.mbarrier::complete_tx::bytes"


@lru_cache(maxsize=256)
def _compiled(ptx: str):
    from factory.compile import compile_ptx

    return compile_ptx(ptx, "sm_90a")


def compile_reports(ptxs: list[str]) -> list:
    """The compile report (factory.compile.CompileReport) of each PTX text for sm_90a, compiled
    side by side (nvJitLink releases the GIL); each text once while it stays among the last 256
    (one cache for every family that renders through these helpers)."""
    todo = list(dict.fromkeys(ptxs))
    if len(todo) > 1:
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1, len(todo))) as pool:
            list(pool.map(_compiled, todo))
    return [_compiled(p) for p in ptxs]


def ptx_head(entry: str, comment: str, plist: list[str], maxnreg: int, threads: int) -> list[str]:
    """The lines before an entry's register declarations, up to the opening "{" exclusive:
    the comment, PTX version and target, the dynamic shared memory (1024-byte aligned), the
    entry with its parameters, .maxnreg and .reqntid."""
    return [
        "//",
        f"// {entry}: {comment}",
        "//",
        f".version {PTX_VERSION}",
        ".target sm_90a",
        ".address_size 64",
        "",
        ".extern .shared .align 1024 .b8 dsmem[];",
        "",
        f".visible .entry {entry}(",
        "    " + ",\n    ".join(plist),
        ")",
        f".maxnreg {maxnreg}",
        f".reqntid {threads}, 1, 1",
    ]


class HopperKernel:
    """Helpers over `self.b` (a Builder) and `self.s.stages`."""

    def op(self, t: str) -> None:
        self.b.op(t)

    def r32(self) -> str:
        return self.b.reg("b32")

    def r64(self) -> str:
        return self.b.reg("b64")

    def pred(self) -> str:
        return self.b.reg("pred")

    def wait(self, bar: str, parity: str, cluster: bool = False) -> None:
        """Spin until the mbarrier at shared address `bar` has completed the phase of `parity`
        (with `cluster`, acquiring what a peer CTA released before its remote arrive)."""
        lab = self.b.new_label("wait")
        p = self.pred()
        self.b.label(lab)
        sem = ".acquire.cluster" if cluster else ""
        self.op(f"mbarrier.try_wait.parity{sem}.shared::cta.b64 {p}, [{bar}], {parity}")
        self.op(f"@!{p} bra {lab}")

    def advance(self) -> None:
        """Next ring slot (%stage); the phase bit (%phase) flips on wrap-around."""
        p = self.pred()
        self.op("add.u32 %stage, %stage, 1")
        self.op(f"setp.eq.u32 {p}, %stage, {self.s.stages}")
        self.op(f"@{p} mov.u32 %stage, 0")
        self.op(f"@{p} xor.b32 %phase, %phase, 1")

    def claim_slot(self, cluster: bool = False) -> str:
        """Producer: wait until the consumers released ring slot %stage (its empty barrier in
        the phase before %phase: a fresh barrier's "previous phase" counts as complete);
        returns the slot's full barrier address."""
        par, off, full, empty = self.r32(), self.r32(), self.r32(), self.r32()
        self.op(f"xor.b32 {par}, %phase, 1")
        self.op(f"shl.b32 {off}, %stage, 3")
        self.op(f"add.u32 {full}, %full, {off}")
        self.op(f"add.u32 {empty}, %empty, {off}")
        self.wait(empty, par, cluster=cluster)
        return full

    def smem_base(self) -> None:
        """%base: the dynamic shared memory rounded up to 1024 bytes (the swizzle's period)."""
        self.op("mov.u32 %base, dsmem")
        self.op("add.u32 %base, %base, 1023")
        self.op("and.b32 %base, %base, -1024")

    def init_barriers(self, counts: list[tuple[str, int]]) -> None:
        """Thread 0 initialises each mbarrier (address, expected arrivals), then fences the
        initialisation for the cluster and the async proxy; no barrier follows."""
        p0 = self.pred()
        lab_init = self.b.new_label("init_done")
        self.op(f"setp.ne.u32 {p0}, %tx, 0")
        self.op(f"@{p0} bra {lab_init}")
        for addr, n in counts:
            self.op(f"mbarrier.init.shared::cta.b64 [{addr}], {n}")
        self.op("fence.mbarrier_init.release.cluster")
        self.op("fence.proxy.async.shared::cta")
        self.b.label(lab_init)

    def prefetch_maps(self, names) -> dict[str, str]:
        """Generic addresses of the tensor-map parameters `names`, each prefetched."""
        gm = {}
        for pname in names:
            r0, r1 = self.r64(), self.r64()
            self.op(f"mov.u64 {r0}, {pname}")
            self.op(f"cvta.param.u64 {r1}, {r0}")
            self.op(f"prefetch.tensormap [{r1}]")
            gm[pname] = r1
        return gm

    def consumer_lanes(self) -> tuple[str, str, str, str]:
        """(consumer warpgroup index, warp in the warpgroup, lane, lane == 0 predicate) of a
        thread of a consumer warpgroup (warpgroup %wg >= 1)."""
        cons, warp, lane = self.r32(), self.r32(), self.r32()
        self.op(f"sub.u32 {cons}, %wg, 1")
        self.op(f"shr.u32 {warp}, %tx, 5")
        self.op(f"and.b32 {warp}, {warp}, 3")
        self.op(f"and.b32 {lane}, %tx, 31")
        plane0 = self.pred()
        self.op(f"setp.eq.u32 {plane0}, {lane}, 0")
        return cons, warp, lane, plane0

    def desc(self, addr16: str, const: int = DESC_CONST) -> str:
        """A 64-bit wgmma descriptor: `addr16` (a shared address >> 4) or'ed with `const`."""
        d = self.r64()
        self.op(f"cvt.u64.u32 {d}, {addr16}")
        self.op(f"or.b64 {d}, {d}, {const}")
        return d

    def _ptr(self, pname: str) -> str:
        """The global address in the u64 parameter `pname`."""
        r, g = self.r64(), self.r64()
        self.op(f"ld.param.u64 {r}, [{pname}]")
        self.op(f"cvta.to.global.u64 {g}, {r}")
        return g
