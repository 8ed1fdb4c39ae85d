"""A format-1 batch for one catalogue operator, as the benchmark suite builds it (its starting
candidates at the given shapes, the named baselines, the manifest's held-out shapes plus a row
past any register capacity), for the GPU worker's tests on a GPU."""

from __future__ import annotations

import uuid

from factory.emit import emit
from factory.families.row.ir import lower
from factory.families.row.seeds import candidate_schedules
from factory.spec import catalogue_manifest, load_catalogue


def catalogue_batch(
    name: str, shapes: list[dict], baselines: list[str], budget_s: float, candidates: int = 0
):
    """(workload, batch): the first `candidates` (all: 0) distinct starting schedules over
    `shapes`, each emitted."""
    w = load_catalogue()[name]
    ir = lower(w)
    picked: list = []
    for dims in shapes:
        picked += [s for s in candidate_schedules(ir, dims) if s not in picked]
    if candidates:
        picked = picked[:candidates]
    cands = []
    for s in picked:
        em = emit(ir, s)
        cands.append(
            {
                "id": f"{name}:{s.tag()}",
                "ptx": em.ptx,
                "entry": em.entry,
                "params": [
                    {"kind": p.kind, "ptx_type": p.ptx_type, "name": p.name} for p in em.params
                ],
                "launch": {
                    "grid": list(em.launch.grid),
                    "block": list(em.launch.block),
                    "smem_bytes": em.launch.smem_bytes,
                    "cluster": None,
                },
            }
        )
    heldout = [dict(h) for h in w.heldout_shapes] + [
        {d: (7 if d != ir.row_dim else 40000) for d in shapes[0]}
    ]
    batch = {
        "format": 1,
        "batch_id": str(uuid.uuid4()),
        "manifest": catalogue_manifest(name),
        "baseline_source": None,
        "shapes": shapes,
        "heldout_shapes": heldout,
        "candidates": cands,
        "baselines": list(baselines),
        "options": {
            "time_budget_s_per_candidate": budget_s,
            "timeout_s_per_candidate": 60,
            "seed": None,
        },
    }
    return w, batch
