"""Byte movers as entrants of bench.direct: kernels that compute nothing and move a case's own
bytes (each input read once, as many bytes written as its outputs), in several layouts. Importing
this module registers them with bench.direct under the prefix "mover:".

The worker's judge_mix (gpuworker/kernels/judge.cu) is its in-run ceiling for an operator's mix
of reads and writes: one 16-byte vector per thread, one tile of 256 vectors per block, as many
blocks as tiles. lab/kernels/mover.cu holds the layouts it was chosen over: two or four vectors
per thread per tile (`tiled_v2`, `tiled_v4`), and its first layout, a grid-stride loop of four
vectors per step in one wave of four resident blocks per SM (`gridstride_u4`), which moved
RMSNorm's bytes at only 93-94% of the copy ceiling (bench/results/2026-12-03-h200-mover/). Name
them as baselines of bench.direct (`mover:judge_mix`, `mover:tiled_v2`, ...), for instance in
lab.probes.drain:

    python3 -m lab.probes.drain --out DIR --plan lab/plans/suite-2026-12-03s.json \\
        --ops silu_mul,rmsnorm,cross_entropy,relu2 --shapes 3 \\
        --baselines torch_compile,mover:judge_mix,mover:tiled_v2,mover:tiled_v4,mover:gridstride_u4
"""

from __future__ import annotations

import sys

from bench import direct
from gpuworker import child
from lab.probes._ptx import KERNELS, ptx_path  # noqa: F401 - KERNELS for the tests

# variant -> (PTX file, entry, vectors per thread per block tile; 0: one wave of resident blocks);
# "mover" stands for lab/kernels/mover.ptx, built from mover.cu on first use
VARIANTS = {
    "judge_mix": (child.JUDGE_PTX, "judge_mix", 1),
    "tiled_v2": ("mover", "mover_tiled_v2", 2),
    "tiled_v4": ("mover", "mover_tiled_v4", 4),
    "gridstride_u4": ("mover", "mover_gridstride_u4", 0),
}
WAVE_BLOCKS_PER_SM = 4  # gridstride_u4: its 64 registers let four 256-thread blocks be resident
_LOADED: dict = {}


def grid_for(variant: str, n: int, sm_count: int) -> int:
    """Blocks of 256 threads for n vectors: one per tile, or one wave for the grid-stride loop."""
    per_thread = VARIANTS[variant][2]
    if per_thread == 0:
        return max(1, min(sm_count * WAVE_BLOCKS_PER_SM, -(-n // (256 * 4))))
    return max(1, -(-n // (256 * per_thread)))


def mover_entrant(bench, name: str, inputs: dict, outputs: dict):
    """(run, config) for `mover:<variant>`: reads the case's input tensors, writes scratch
    tensors the size of its outputs (its own, so the case's outputs keep their checks)."""
    from cuda.core import Device, LaunchConfig, ObjectCode, launch

    variant = name.split(":", 1)[1]
    if variant not in VARIANTS:
        raise ValueError(f"no byte mover {variant!r}: one of {sorted(VARIANTS)}")
    path, entry, _ = VARIANTS[variant]
    if path == "mover":
        path = ptx_path("mover")
    if (path, entry) not in _LOADED:
        _LOADED[path, entry] = ObjectCode.from_ptx(path.read_bytes()).get_kernel(entry)
    kernel = _LOADED[path, entry]
    torch = bench.torch
    scratch = [
        torch.empty(t.numel() * t.element_size(), dtype=torch.uint8, device="cuda")
        for t in outputs.values()
    ]
    ins = [(t.data_ptr(), t.numel() * t.element_size() // 16) for t in inputs.values()]
    outs = [(t.data_ptr(), t.numel() // 16) for t in scratch]
    args = child.mix_args(ins, outs)
    n = int(args[-1])
    sm_count = Device().properties.multiprocessor_count
    cfg = LaunchConfig(grid=grid_for(variant, n, sm_count), block=256)

    def run(scratch=scratch):  # scratch kept alive with the closure
        launch(bench.stream, cfg, kernel, *args)

    config = {
        "kernel": entry,
        "grid": cfg.grid,
        "bytes_read": 16 * sum(c for _, c in ins),
        "bytes_written": 16 * sum(c for _, c in outs),
    }
    return run, config


def _entrant(bench, name: str, workload, inputs: dict, outputs: dict):
    run, config = mover_entrant(bench, name, inputs, outputs)
    return run, config, None


direct.EXTRA_ENTRANTS["mover:"] = _entrant

if __name__ == "__main__":  # the suite, with the movers as baselines (see the docstring)
    from bench import suite

    sys.exit(suite.main())
