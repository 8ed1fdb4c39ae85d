"""Row kernels fed by the bulk-copy engine (lab/kernels/bulkrows.cu) as entrants of bench.direct.

An experiment beside the generator: a persistent block keeps S rows in flight in shared memory,
loaded by cp.async.bulk, instead of every thread loading its part of the row with ld.global.
Name them as baselines, `bulk:<kernel>@<blocks per SM>`, for instance

    python3 -m lab.probes.bulkrows --direct --out DIR --plan lab/plans/suite-2026-12-03s.json \\
        --ops rmsnorm --shapes 3 --baselines torch_compile,bulk:rms_t256k4s3r@4

`bulk:regrms_t<T>k<K>s<1|2><e|n>@<blocks>` is the control: the same persistent block with RMSNorm's
weight resident in registers, but each row loaded straight into registers by ld.global (one row
at a time, or the next row into a second buffer), with or without the L2 evict-last policy.

Each is verified against the float64 reference like any baseline (outputs of its own, poisoned
first); a kernel whose row length (threads x vectors x 8) is not the case's N is unavailable.
"""

from __future__ import annotations

import re
import sys

import numpy as np

from bench import direct
from lab.probes._ptx import ptx_path

_NAME = re.compile(
    r"^bulk:(rms|softmax)_t(\d+)k(\d+)s(\d+)([rb])@(\d+)$"
    r"|^bulk:(regrms)_t(\d+)k(\d+)s([12])([en])@(\d+)$"
)
_LOADED: dict = {}
# workload name -> the kernel families that compute it (regrms: rows loaded into registers by
# ld.global, the weight resident in registers; no bulk copies, no stages in shared memory)
OPS = {"rmsnorm": ("rms", "regrms"), "softmax": ("softmax",)}


class NotThisShape(ValueError):
    """The kernel's row length is fixed at compile time and differs from the case's."""


def parse(name: str) -> dict:
    """`bulk:rms_t256k4s3r@4` -> op, threads, vectors per thread, stages, store, blocks per SM;
    `bulk:regrms_t256k4s1e@3`: stages are the rows in registers, the letter the L2 hint."""
    m = _NAME.match(name)
    if not m:
        raise ValueError(
            f"not a bulk-row kernel name: {name!r} (bulk:<rms|softmax>_t<T>k<K>s<S><r|b>@<blocks>"
            " or bulk:regrms_t<T>k<K>s<1|2><e|n>@<blocks>)"
        )
    op, t, k, s, letter, per_sm = [g for g in m.groups() if g is not None]
    return {
        "op": op,
        "entry": f"bulk_{op}_t{t}k{k}s{s}{letter}",
        "threads": int(t),
        "vectors": int(k),
        "stages": int(s),
        "bulk_store": letter == "b",
        "blocks_per_sm": int(per_sm),
    }


def launch_shape(spec: dict, m: int, n: int, sm_count: int) -> tuple[int, int]:
    """(grid, dynamic shared memory bytes) for M rows of N bf16: one persistent wave."""
    if n != spec["threads"] * spec["vectors"] * 8:
        raise NotThisShape(
            f"{spec['entry']} holds rows of {spec['threads'] * spec['vectors'] * 8}, not {n}"
        )
    smem = 0 if spec["op"] == "regrms" else spec["stages"] * n * 2
    return min(m, sm_count * spec["blocks_per_sm"]), smem


def bulk_entrant(bench, name: str, workload: str, inputs: dict):
    """(run, config, box): box["out"] holds the outputs of the last run, by output name."""
    from cuda.core import Device, LaunchConfig, ObjectCode, launch

    from gpuworker import gpu

    spec = parse(name)
    op = spec["op"]
    if op not in OPS.get(workload, ()):
        raise NotThisShape(f"{name} computes {op}, not {workload}")
    x = inputs["x"]
    m, n = x.shape
    dev = Device()
    grid, smem = launch_shape(spec, m, n, dev.properties.multiprocessor_count)
    if spec["entry"] not in _LOADED:
        ptx = ptx_path("bulkrows").read_bytes()
        kernel = ObjectCode.from_ptx(ptx).get_kernel(spec["entry"])
        _LOADED[spec["entry"]] = kernel
    kernel = _LOADED[spec["entry"]]
    if smem:
        gpu.set_max_dynamic_smem(kernel, smem, dev.device_id)
    y = bench.torch.full_like(x, float("nan"))  # poisoned: the first check sees its writes
    cfg = LaunchConfig(grid=grid, block=spec["threads"], shmem_size=smem)
    ptrs = [x.data_ptr()] + ([inputs["w"].data_ptr()] if op != "softmax" else []) + [y.data_ptr()]
    args = [*ptrs, np.int32(m), np.int32(n)]
    box = {"out": {"y": y}}

    def run():
        launch(bench.stream, cfg, kernel, *args)

    config = {"kernel": spec["entry"], "grid": grid, "block": spec["threads"], "smem": smem}
    return run, config, box


def _entrant(bench, name: str, workload, inputs: dict, outputs: dict):
    return bulk_entrant(bench, name, workload.name, inputs)  # NotThisShape: unavailable


direct.EXTRA_ENTRANTS["bulk:"] = _entrant

if __name__ == "__main__":  # the suite in direct mode, with these kernels as baselines
    from bench import suite

    sys.exit(suite.main())
