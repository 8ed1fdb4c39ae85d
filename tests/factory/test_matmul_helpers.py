"""Shared by the wgmma GEMM tests: whether nvJitLink can be imported (its compile tests skip
without it), and the element index at which wgmma's 128-byte swizzle descriptors read a tile."""

from __future__ import annotations

import numpy as np

from factory.families.matmul import tiling


def nvjitlink_available() -> bool:
    try:
        from cuda.bindings import nvjitlink  # noqa: F401
    except Exception:  # noqa: BLE001
        return False
    return True


def wgmma_read_idx(rows, base_row):
    """Element index (2-byte elements) of (row, k) for k in 0..63 of each of `rows`, read
    through tiling.wgmma_k_major_offset from the tile starting at row `base_row`."""
    ks = np.arange(64)
    return (
        np.array(
            [
                [
                    tiling.wgmma_k_major_offset(32 * (kk // 16), base_row + r, (2 * kk) % 32)
                    for kk in ks
                ]
                for r in rows
            ]
        )
        // 2
    )
