"""The tile assignments of the wgmma GEMM's schedule kinds, in Python as the emitter writes
them: every output tile computed exactly once (persistent cooperative CTAs, ping-pong consumers
taking turns, 2x1 cluster pairs along M with a phantom row past an odd tile count, split-K
clusters), so a slip in the walk shows without a GPU."""

from __future__ import annotations

import itertools

import pytest

from factory.families.matmul import tiling

SHAPES = [(1, 1, 1), (7, 3, 8), (8, 8, 8), (33, 5, 4), (2, 64, 16)]


@pytest.mark.parametrize(("tiles_m", "tiles_n", "group_m"), SHAPES)
@pytest.mark.parametrize("ctas", [1, 5, 132])
def test_cooperative_and_pingpong_walks_cover_every_tile_once(tiles_m, tiles_n, group_m, ctas):
    tiles = tiles_m * tiles_n
    ctas = min(ctas, tiles)
    coop = [
        tiling.tile_coords(t, tiles_m, tiles_n, group_m)
        for cta in range(ctas)
        for t in tiling.cta_tiles(cta, ctas, tiles)
    ]
    want = sorted(itertools.product(range(tiles_m), range(tiles_n)))
    assert sorted(coop) == want
    # ping-pong: consumer c of a CTA takes its CTA's tiles c, c + 2, ...: cta + (c + 2 i) * ctas
    pp = []
    for cta in range(ctas):
        for c in (0, 1):
            ci = c
            while cta + ci * ctas < tiles:
                pp.append(tiling.tile_coords(cta + ci * ctas, tiles_m, tiles_n, group_m))
                ci += 2
    assert sorted(pp) == want


@pytest.mark.parametrize(("tiles_m", "tiles_n", "group_m"), SHAPES)
def test_cluster_pairs_cover_every_tile_row_once(tiles_m, tiles_n, group_m):
    units_m = (tiles_m + 1) // 2  # the emitter's %units_m: pairs of tile rows
    got = []
    for u in range(units_m * tiles_n):
        pm, tn = tiling.tile_coords(u, units_m, tiles_n, group_m)
        for rank in (0, 1):
            got.append((2 * pm + rank, tn))
    real = sorted(x for x in got if x[0] < tiles_m)
    assert real == sorted(itertools.product(range(tiles_m), range(tiles_n)))
    # the only tiles past M: the second row of the last pair when the tile rows are odd
    assert len(got) - len(real) == (tiles_n if tiles_m % 2 else 0)


@pytest.mark.parametrize("split_k", [2, 4])
@pytest.mark.parametrize("nk", [1, 3, 4, 129])
def test_split_k_clusters_sum_each_k_block_of_each_tile_once(split_k, nk):
    tiles = 6
    seen = {}
    for cta in range(tiles * split_k):  # the grid: a cluster of split_k CTAs per tile
        tile, rank = cta // split_k, cta % split_k
        for kb in range(*tiling.splitk_range(rank, nk, split_k)):
            seen[(tile, kb)] = seen.get((tile, kb), 0) + 1
    assert seen == {(t, kb): 1 for t in range(tiles) for kb in range(nk)}
