"""lab.probes.probe_tail: two emitters' kernels at rows no layout divides. What a CPU can do of it
(emitting, the manifest, the table) is checked here; the timing is for the GPU
(gpu_pending.sh tail)."""

from __future__ import annotations

import json

from factory.compile import compile_ptx, rejection_reason
from factory.families.row.schedules import Schedule
from lab.probes import probe_tail


def test_emit_writes_every_candidate_with_what_a_gpu_host_needs_to_launch_it(tmp_path):
    cases = list(probe_tail.CASES)
    try:
        assert probe_tail.main(["--emit-to", str(tmp_path), "--cases", "silu_mul:64x4999"]) == 0
    finally:
        probe_tail.CASES[:] = cases
    book = json.loads((tmp_path / "manifest.json").read_text())
    assert book and all(r["dims"] == {"N": 4999, "M": 64} for r in book)
    for r in book:
        ptx = (tmp_path / r["file"]).read_text()
        em = probe_tail._emitted(r, ptx)
        s = Schedule.from_dict(r["schedule"])
        assert s.tag() == r["tag"] and s.flat  # elementwise rows of 4999 walk as one run
        assert em.entry in ptx and em.launch.grid[0].startswith("ceildiv((M)*N")
        rep = compile_ptx(ptx)
        assert rejection_reason(rep, s.threads_per_block) == ""
        assert rep.registers == r["registers"]


def test_the_table_pairs_a_layout_whatever_its_tail_and_names_each_sets_fastest():
    def rec(s, tag, us):
        return {"impl": "ours", "set": s, "tag": tag, "registers": 40, "status": "passed",
                "median_us": us, "tbps": 4.0}  # fmt: skip

    case = {
        "op": "rmsnorm",
        "dims": {"N": 4999, "M": 16384},
        "records": [
            rec("old", "ct128r1v8c5z_elno", 150.0),
            rec("new", "ct128r1v8c5j_elno", 110.0),
            rec("old", "ct256r1v8c4_elno", 160.0),
            {"impl": "torch_compile", "set": "baseline", "tag": "torch_compile",
             "median_us": 161.8, "status": "passed", "tbps": 2.0},
        ],
    }  # fmt: skip
    md = probe_tail.table([case], ["old", "new"], 4.28)
    assert "| rmsnorm 16384x4999 | 150.0 us" in md and "110.0 us" in md
    assert "torch_compile 161.8" in md
    assert "| rmsnorm 16384x4999 | ct128r1v8c5_elno | 150.0 (40 regs) | 110.0 (40 regs) |" in md
    assert "ct256r1v8c4_elno |" not in md.split("| case | layout |")[1]  # only one set had it
