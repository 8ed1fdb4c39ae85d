"""lab.probes.mover: the byte mover layouts that bench.direct times beside the worker's judge_mix.
The kernels compile here; their timing is for the GPU (lab/device/gpu_pending.sh movers)."""

from __future__ import annotations

import re
import shutil

import pytest

from factory.compile import compile_ptx
from gpuworker import child
from lab.probes import mover
from lab.probes._ptx import ptx_path


def _mover_ptx():
    if shutil.which("nvcc") is None and not (mover.KERNELS / "mover.ptx").exists():
        pytest.skip("lab/kernels/mover.ptx is not built and there is no nvcc here")
    return ptx_path("mover")


def test_every_variant_names_an_entry_of_its_ptx_that_links_without_spills():
    for variant, (path, entry, _) in mover.VARIANTS.items():
        ptx = (_mover_ptx() if path == "mover" else path).read_text()
        assert f".visible .entry {entry}(" in ptx, variant
        params = re.findall(rf"\.param \.(\w+) {entry}_param_\d+", ptx)
        assert params == ["u64"] * 13, variant  # judge_mix's arguments, so mix_args serves all
    rep = compile_ptx(_mover_ptx().read_text(), "sm_90")
    assert rep.ok, rep.log
    for entry in ("mover_tiled_v2", "mover_tiled_v4", "mover_gridstride_u4"):
        line = rep.log.split(f"Function properties for '{entry}'")[1].splitlines()[1]
        assert "0 stack" in line and "0 bytes lmem" in line


def test_tiled_movers_launch_one_block_per_tile_and_the_grid_stride_one_wave():
    n = 16384 * 4096 * 2 // 16  # SiLU-mul 16384x4096: one bf16 tensor in 16-byte vectors
    assert mover.grid_for("judge_mix", n, 132) == child.mix_blocks(n) == n // 256
    assert mover.grid_for("tiled_v4", n, 132) == n // 1024
    assert mover.grid_for("tiled_v4", n + 1, 132) == n // 1024 + 1  # a partial last tile
    assert mover.grid_for("gridstride_u4", n, 132) == 132 * 4
    assert mover.grid_for("gridstride_u4", 1024 * 3 + 1, 132) == 4  # fewer when n is small


def test_mix_args_are_four_inputs_two_outputs_then_the_largest_count():
    args = child.mix_args([(0x10, 8), (0x20, 8)], [(0x30, 4)])
    assert args == [0x10, 8, 0x20, 8, 0, 0, 0, 0, 0x30, 4, 0, 0, 8]
    counts = args[1:12:2] + [args[12]]  # long long: np.int64, never a plain int (a pointer)
    assert [type(a).__name__ for a in counts] == ["int64"] * 7
    assert all(type(p) is int for p in args[0:12:2])
    with pytest.raises(ValueError, match="at most 4 inputs"):
        child.mix_args([(1, 1)] * 5, [])
