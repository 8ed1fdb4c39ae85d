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
