"""Every layout the matmul space lets through compiles clean with nvJitLink (as the product
compiles): one schedule per (tile, consumers, ping-pong, staging, split, tile_k, load), at its
deepest ring, for the plain GEMM at a held-out shape (K % 64 != 0, so both load paths are in the
space), without spills (ping-pong within the 256 bytes test_matmul_emit allows) and without
ptxas serialising the wgmmas (C7509/C7511/C7515). The named variants are compiled with every
epilogue in test_matmul_emit; this covers the space's other points (ping-pong tiles 160 and 192
wide spilled 1.4-2.2 KB there and is_valid now refuses them)."""

from __future__ import annotations

import os
import re
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from factory.families.matmul import schedule as sched_mod  # noqa: E402
from factory.families.matmul import space  # noqa: E402
from factory.families.matmul.ir import plain  # noqa: E402


def _nvjitlink() -> bool:
    try:
        from cuda.bindings import nvjitlink  # noqa: F401
    except Exception:  # noqa: BLE001
        return False
    return True


@pytest.mark.skipif(not _nvjitlink(), reason="nvJitLink is not installed")
def test_every_layout_of_the_space_compiles_clean(monkeypatch):
    from factory.emit.hopper import compile_reports
    from factory.families.matmul.emit import emit

    monkeypatch.setattr(sched_mod, "CP_ASYNC_VERIFIED", True)
    space._SPACES.clear()
    try:
        pool = space.space(plain(), [{"M": 3000, "N": 5000, "K": 2056}])
    finally:
        space._SPACES.clear()
    deepest: dict = {}
    for s in pool:
        if s.persistent and s.group_m != 8:
            continue
        key = (s.tile_m, s.tile_n, s.consumers, s.pingpong, s.tma_store, s.split_k, s.tile_k)
        key += (s.load, s.persistent)
        if key not in deepest or s.stages > deepest[key].stages:
            deepest[key] = s
    todo = list(deepest.values())
    assert {s.load for s in todo} == {"tma", "cp_async"} and any(s.pingpong for s in todo)
    reports = compile_reports([emit(plain(), s).ptx for s in todo])
    bad = []
    for s, r in zip(todo, reports, strict=True):
        serial = re.findall(r"\(C75(?:09|11|15)\)", r.log)
        if not r.ok or r.spill_store_bytes > (256 if s.pingpong else 0) or serial:
            bad.append((s.label(), r.ok, r.spill_store_bytes, serial))
    assert not bad, bad
