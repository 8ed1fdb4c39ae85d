"""Fakes for the issue-6 tests: a tiny generator and a GPU bench that follow the contracts
(docs/CONTRACTS.md), so the loop can be tested without the generator's or the GPU's real code.
No tests live here."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from dataclasses import asdict, dataclass

from factory.families import Family
from factory.spec.expr import Input, Reduce
from factory.spec.types import (
    BaselineKernel,
    KernelParam,
    Launch,
    OutputDecl,
    TensorDecl,
    Tolerance,
    Workload,
)


def make_workload(
    name: str = "softmax",
    *,
    dims: dict | None = None,
    dtype: str = "fp32",
    baseline: BaselineKernel | None = None,
    tags: tuple = (),
    input_name: str = "x",
) -> Workload:
    dims = dims or {"M": 1024, "N": 4096}
    x = Input(input_name, ("M", "N"), dtype)
    expr = Reduce("max", x, 1, True, ("M", 1))
    manifest = f"# fake {name} {dtype} {json.dumps(dims, sort_keys=True)} {input_name}"
    return Workload(
        name=name,
        description="fake",
        inputs=(TensorDecl(input_name, ("M", "N"), dtype),),
        outputs=(OutputDecl("y", ("M", "N"), dtype, expr),),
        shapes=(dict(dims),),
        heldout_shapes=({"M": 3, "N": 1000},),
        tolerance={dtype: Tolerance(1e-5, 1e-5, 1e-5)},
        target="sm_90",
        manifest=manifest,
        sha256=hashlib.sha256(manifest.encode()).hexdigest(),
        baseline=baseline,
        tags=tags,
    )


@dataclass(frozen=True)
class FakeSchedule:
    block: int
    vec: int
    unroll: int
    cache: str


@dataclass
class FakeEmitted:
    ptx: str
    entry: str
    params: tuple
    launch: Launch


def _emit(ir, s: FakeSchedule) -> FakeEmitted:
    ptx = (
        ".version 8.0\n.target sm_90\n.address_size 64\n"
        f"// schedule: {json.dumps(asdict(s), sort_keys=True)}\n"
        ".visible .entry k(.param .u64 k_x, .param .u64 k_y, .param .u32 k_N)\n{\n ret;\n}\n"
    )
    params = (
        KernelParam("tensor", "u64", "x"),
        KernelParam("tensor", "u64", "y"),
        KernelParam("dim", "u32", "N"),
    )
    return FakeEmitted(ptx, "k", params, Launch(("M", 1, 1), (s.block, 1, 1)))


def fake_generator(*, refuse: bool = False) -> Family:
    def lower(w):
        if refuse:
            raise ValueError("Unsupported: gathers")
        return {"workload": w.name}

    def space(ir, dims_list):
        return [
            FakeSchedule(b, v, u, c)
            for b, v, u, c in itertools.product(
                (64, 128, 256, 512, 1024), (1, 2, 4, 8), (1, 2, 4), ("none", "evict_first")
            )
        ]

    def is_valid(ir, s, dims):
        return not (s.vec == 8 and s.unroll == 4)  # an invalid corner, as real spaces have

    def default_schedule(ir, dims_list):
        return FakeSchedule(128, 1, 1, "none")

    return Family(lower, space, is_valid, _emit, default_schedule, name="fake")


def fake_time_us(schedule: dict, dims: dict) -> float:
    """A smooth landscape with one optimum that moves with N: block 256 (512 for N >= 8192),
    vec 4, unroll 2, evict_first a little better."""
    n = dims.get("N", 4096)
    best_block = 512 if n >= 8192 else 256
    bytes_moved = 2 * 4 * dims.get("M", 1) * n
    floor_us = 2.0 + bytes_moved / 4.3e6
    penalty = (
        1
        + 0.35 * abs(math.log2(schedule["block"] / best_block))
        + 0.5 * abs(math.log2(schedule["vec"] / 4))
        + 0.2 * abs(math.log2(schedule["unroll"] / 2))
        + (0.0 if schedule["cache"] == "evict_first" else 0.05)
    )
    return floor_us * penalty


def fake_compile(ptx: str, arch: str = "sm_90") -> dict:
    return {
        "ok": True,
        "log": "",
        "registers": 32,
        "spill_store_bytes": 0,
        "spill_load_bytes": 0,
        "stack_bytes": 0,
        "smem_bytes": 0,
        "barriers": 0,
    }


class FakeBench:
    """bench_fn: times from `fake_time_us` on the schedule printed in the PTX; customer-edit
    PTX (no schedule comment) runs at `customer_us` scaled by `edit_speedup`."""

    def __init__(self, customer_us: float = 500.0):
        self.batches: list[dict] = []
        self.customer_us = customer_us

    def __call__(self, batch: dict) -> dict:
        self.batches.append(batch)
        out = []
        for c in batch["candidates"]:
            m = re.search(r"// schedule: (\{.*\})", c["ptx"])
            timing = []
            for dims in batch["shapes"]:
                if m:
                    us = fake_time_us(json.loads(m.group(1)), dims)
                else:
                    us = self.customer_us * (0.9 if "ld.global.nc" in c["ptx"] else 1.0)
                    us *= 0.97 if "st.global.cs" in c["ptx"] else 1.0
                timing.append({"dims": dims, "median_us": us, "tbps": 1.0, "bytes": 1})
            out.append({"id": c["id"], "status": "passed", "reason": "", "timing": timing})
        baselines = [
            {
                "name": b,
                "status": "passed",
                "timing": [{"dims": d, "median_us": self.customer_us} for d in batch["shapes"]],
            }
            for b in batch["baselines"]
        ]
        return {
            "format": 1,
            "batch_id": batch["batch_id"],
            "env": {"sm": "sm_90"},
            "candidates": out,
            "baselines": baselines,
        }


def sweep_best_us(dims: dict) -> float:
    gen = fake_generator()
    return min(
        fake_time_us(asdict(s), dims)
        for s in gen.space(None, [dims])
        if gen.is_valid(None, s, dims)
    )
