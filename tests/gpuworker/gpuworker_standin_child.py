"""A stand-in for gpuworker.child.child_main on hosts without a GPU: it speaks the child's pipe
protocol (hello, setup, copy_ceiling, byte_mover, verify, time, stop) and its deadline contract,
with no CUDA.

A candidate whose entry is `infinite_loop` hangs: the stand-in promises progress within the
request's time limit and then sleeps past it, as a kernel that never finishes would. Setup takes
STANDIN_PREP_S seconds (from the environment, which spawned children inherit), the stand-in's
version of creating a context and uploading the batch's data. Only the standard library is
imported, so a spawned stand-in starts quickly.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "redteam"

RUN = {"rel_err": 0.0, "max_abs_err": 0.0, "nonfinite": 0, "bad_elements": 0,
       "first_bad_index": -1, "passed": True}  # fmt: skip
CHECKS = {"runs_checked": 3, "runs_failed": 0, "worst_rel_err": 0.0, "max_abs_err": 0.0,
          "nonfinite": 0, "bad_elements": 0, "first_failure": None}  # fmt: skip


def fixture_candidate(cid: str, entry: str) -> dict:
    """A batch candidate from a red-team PTX fixture (x, y, M, N; one 64-thread block per row)."""
    return {
        "id": cid,
        "ptx": (FIXTURES / f"{entry}.ptx").read_text(),
        "entry": entry,
        "params": [
            {"kind": "tensor", "ptx_type": "u64", "name": "x"},
            {"kind": "tensor", "ptx_type": "u64", "name": "y"},
            {"kind": "dim", "ptx_type": "u32", "name": "M"},
            {"kind": "dim", "ptx_type": "u32", "name": "N"},
        ],
        "launch": {"grid": ["M", 1, 1], "block": [64, 1, 1], "smem_bytes": 0},
    }


def softmax_batch(batch_id: str, candidates: list[dict], options: dict) -> dict:
    """A format-1 batch of the catalogue softmax at one small shape (4 x 64), no baselines."""
    from factory.spec import catalogue_manifest

    return {
        "format": 1,
        "batch_id": batch_id,
        "manifest": catalogue_manifest("softmax"),
        "shapes": [{"M": 4, "N": 64}],
        "heldout_shapes": [],
        "candidates": candidates,
        "baselines": [],
        "options": options,
    }


def healthy_reply(msg: dict, shapes: dict) -> dict:
    """What a healthy GPU answers to copy_ceiling, verify and time (every check passes)."""
    op = msg["op"]
    if op == "copy_ceiling":
        return {"ok": True, "bytes": 1, "median_us": 1.0, "samples_us": [1.0], "tbps": 4.0,
                "l2_flush": msg.get("l2_flush", "read")}  # fmt: skip
    if op == "byte_mover":  # a healthy mover of each shape's bytes, a little above the copy
        return {
            "ok": True,
            "l2_flush": msg.get("l2_flush", "read"),
            "shapes": [
                {
                    "index": i,
                    "dims": shapes[i]["dims"],
                    "bytes_read": 2,
                    "bytes_written": 1,
                    "median_us": 1.0,
                    "samples_us": [1.0],
                    "tbps": 4.2,
                }  # fmt: skip
                for i in msg["shapes"]
            ],
        }
    if op == "verify":
        return {
            "ok": True,
            "shapes": [
                {
                    "shape": i,
                    "outputs": {
                        n: {"runs": [RUN, RUN], "bitwise_diff_bytes": 0}
                        for n in shapes[i]["outputs"]
                    },
                    "output_guard_bytes_changed": 0,
                    "input_guard_bytes_changed": 0,
                    "input_bytes_changed": 0,
                }
                for i in msg["shapes"]
            ],
        }
    if op == "time":
        return {
            "ok": True,
            "shape": msg["shape"],
            "sets": shapes[msg["shape"]]["sets"],
            "sm_clocks_mhz": [1980],
            "l2_flush": msg.get("l2_flush", "read"),
            "entrants": {
                d["key"]: {
                    "samples_us": [10.0, 10.5, 11.0],
                    "timed_checks": CHECKS,
                    "input_bytes_changed": 0,
                }
                for d in msg["entrants"]
            },
        }
    raise AssertionError(f"unexpected request {op}")


def _hang(deadline, timeout_s: float):
    deadline.value = time.monotonic() + timeout_s
    time.sleep(3600)


def child_main(conn, deadline, current):
    deadline.value = time.monotonic() + 120
    prep_s = float(os.environ.get("STANDIN_PREP_S", "0"))
    conn.send({"ok": True, "hello": {"arch": "sm_90", "l2_bytes": 60 << 20, "pid": os.getpid()}})
    shapes = {}
    while True:
        deadline.value = float("inf")
        try:
            msg = conn.recv()
        except EOFError:
            return
        op = msg.get("op")
        if op == "stop":
            return
        if op == "setup":
            deadline.value = time.monotonic() + 600
            time.sleep(prep_s)
            shapes = {s["index"]: s for s in msg["shapes"]}
            conn.send({"ok": True, "shapes": len(shapes), "pid": os.getpid()})
        elif op in ("copy_ceiling", "byte_mover"):
            conn.send(healthy_reply(msg, shapes))
        elif op == "verify":
            if msg["entrant"].get("entry") == "infinite_loop":
                current.value = -1
                _hang(deadline, msg["timeout_s"])
            conn.send({**healthy_reply(msg, shapes), "pid": os.getpid()})
        elif op == "time":
            for i, d in enumerate(msg["entrants"]):
                if d.get("entry") == "infinite_loop":
                    current.value = i
                    _hang(deadline, msg["timeout_s"])
            conn.send(healthy_reply(msg, shapes))
        elif op == "pid":
            conn.send({"ok": True, "pid": os.getpid()})
        else:
            conn.send({"ok": False, "fatal": False, "error": f"unknown op {op}"})
