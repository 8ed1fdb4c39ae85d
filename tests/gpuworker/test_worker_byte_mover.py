"""The byte mover: judge_mix moves a benchmarked shape's own bytes (every input read once, as many
bytes written as its outputs) under the copy ceiling's protocol, so that a kernel reading more
than it writes is compared with the rate its mix of reads and writes reaches. CUDA calls are
recorded here; tests/gpuworker/test_worker_gpu.py runs it on a GPU."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from test_worker_l2_flush import entry_body

from factory.compile import compile_ptx
from gpuworker import child, gpu

KERNELS = Path(child.__file__).with_name("kernels")


def test_judge_mix_takes_four_inputs_two_outputs_and_keeps_every_load():
    ptx = (KERNELS / "judge.ptx").read_text()
    body = entry_body(ptx, "judge_mix")
    params = re.findall(r"\.param \.(\w+) judge_mix_param_\d+", body)
    assert params == ["u64"] * 13  # (ptr, count) x 4 inputs, x 2 outputs, then n
    # one 16-byte load per input and one 16-byte store per output, no loop
    assert len(re.findall(r"ld\.global(?:\.\w+)*\.v4\.u32", body)) == 4
    assert len(re.findall(r"st\.global(?:\.\w+)*\.v4\.u32", body)) == 2
    rep = compile_ptx(ptx, "sm_90")
    assert rep.ok, rep.log
    mix = rep.log.split("Function properties for 'judge_mix'")[1].splitlines()[1]
    assert "0 stack" in mix and "0 bytes lmem" in mix  # no spills
    # a full SM of 2048 threads, eight blocks of 256 as the child launches it
    regs = int(re.search(r"used (\d+) registers", mix).group(1))
    assert regs * 2048 <= 65536


class _Mem:
    def __init__(self, ptr, nbytes=0):
        self.ptr, self.nbytes, self.freed = ptr, nbytes, False

    def free(self):
        self.freed = True


class _Events:
    def __init__(self, us):
        self.us = list(us)

    def record_start(self, i, stream):
        pass

    def record_end(self, i, stream):
        pass

    def elapsed_us(self, i):
        return self.us.pop(0)


class _Shape:
    def __init__(self, dims, inputs: dict, outputs: dict):
        self.dims = dims
        self.inputs = {
            n: {"slots": [_Mem(0x1000_0000 * (k + 1))], "nbytes": b}
            for k, (n, b) in enumerate(inputs.items())
        }
        self.outputs = {n: {"nbytes": b} for n, b in outputs.items()}


@pytest.fixture
def session(monkeypatch):
    s = child.Session.__new__(child.Session)
    s.sm_count = 132
    s.stream = object()
    s.k_mix = object()
    s.current = type("C", (), {"value": 0})()
    s.deadline = type("D", (), {"value": 0.0})()
    s.calls, s.scratch = [], []
    s.hold = lambda us: s.calls.append(("hold", us))
    s.flush_l2 = lambda mode, r: s.calls.append(("flush", mode))
    s._launch_mix = lambda n, *args: s.calls.append(("launch", s.k_mix, n, args))

    def alloc(nbytes):
        m = _Mem(0xA000_0000 + 0x1000_0000 * len(s.scratch), nbytes)
        s.scratch.append(m)
        return m

    monkeypatch.setattr(gpu, "DeviceMemory", alloc)
    monkeypatch.setattr(gpu, "sync", lambda *a, **k: None)
    return s


def test_silu_mul_bytes_two_inputs_read_one_output_written_timed_as_the_copy_is(session):
    n = 16384 * 4096 * 2  # bytes of one bf16 tensor
    session.shapes = {3: _Shape({"M": 16384, "N": 4096}, {"a": n, "b": n}, {"y": n})}
    # 13 runs; the first three are warm-up, the median of the other ten counts
    session.events = _Events([500.0, 400.0, 300.0] + [90.0 + k for k in range(10)])
    reply = session.op_byte_mover({"shapes": [3], "l2_flush": "read"})
    [m] = reply["shapes"]
    assert reply["l2_flush"] == "read"
    assert (m["index"], m["dims"]) == (3, {"M": 16384, "N": 4096})
    assert (m["bytes_read"], m["bytes_written"]) == (2 * n, n)
    assert m["median_us"] == 94.5 and len(m["samples_us"]) == 10
    assert m["tbps"] == pytest.approx(3 * n / 94.5e-6 / 1e12)
    launches = [c for c in session.calls if c[0] == "launch"]
    assert len(launches) == 13
    assert [c[0] for c in session.calls[:3]] == ["hold", "flush", "launch"]
    assert all(c[1] == "read" for c in session.calls if c[0] == "flush")
    _, kernel, grid_n, args = launches[0]
    n16 = n // 16
    a, b = session.shapes[3].inputs["a"]["slots"][0], session.shapes[3].inputs["b"]["slots"][0]
    [y] = session.scratch
    assert kernel is session.k_mix and grid_n == n16
    assert args[:8] == (a.ptr, n16, b.ptr, n16, 0, 0, 0, 0)  # unused inputs: null, count 0
    assert args[8:] == (y.ptr, n16, 0, 0, n16)  # one output; n = the largest count
    assert all(isinstance(x, np.int64) for x in args[1::2])  # counts are long long, not pointers
    assert y.nbytes == n and y.freed  # the scratch output is the output's size, and is freed


def test_a_shape_with_more_buffers_than_the_mover_takes_is_reported_not_timed(session):
    session.shapes = {
        0: _Shape({"N": 8}, {f"x{k}": 16 for k in range(5)}, {"y": 16}),
        1: _Shape({"N": 16}, {"x": 4096}, {"loss": 8}),  # 8 bytes: less than one vector
    }
    session.events = _Events([10.0] * 13)
    reply = session.op_byte_mover({"shapes": [0, 1]})
    too_many, small = reply["shapes"]
    assert too_many["index"] == 0 and "5 inputs" in too_many["error"] and "tbps" not in too_many
    assert reply["l2_flush"] == "read"  # the batch default when the request names none
    assert (small["bytes_read"], small["bytes_written"]) == (4096, 0)  # whole vectors only
    [launch] = [c for c in session.calls if c[0] == "launch"][:1]
    assert launch[3][9] == 0 and launch[3][-1] == 256  # output count 0; n from the input


def test_the_mover_launches_one_block_per_tile_of_256_vectors():
    assert child.mix_blocks(16384 * 4096 // 8) == 16384 * 4096 // 8 // 256
    assert child.mix_blocks(256 * 5 + 1) == 6  # a partial last tile gets its block
    assert child.mix_blocks(0) == 1


def test_the_copy_ceiling_is_timed_under_the_same_protocol_as_the_mover(session, monkeypatch):
    # Both ceilings share Session._time_ceiling: hold, flush in the entrants' mode, events, 13
    # runs of which the last ten count.
    monkeypatch.setattr(gpu, "memset8", lambda *a: session.calls.append(("memset",)))
    monkeypatch.setattr(gpu, "copy_d2d", lambda d, s, n, st: session.calls.append(("copy", n)))
    session.events = _Events([500.0, 400.0, 300.0] + [100.0 + k for k in range(10)])
    reply = session.op_copy_ceiling({"nbytes": 1 << 20, "l2_flush": "write"})
    copies = [c for c in session.calls if c[0] == "copy"]
    assert len(copies) == 13 and all(c[1] == 1 << 20 for c in copies)
    assert [c[0] for c in session.calls[:4]] == ["memset", "hold", "flush", "copy"]
    assert all(c[1] == "write" for c in session.calls if c[0] == "flush")
    assert reply["median_us"] == 104.5 and len(reply["samples_us"]) == 10
    assert reply["tbps"] == pytest.approx(2 * (1 << 20) / 104.5e-6 / 1e12)
    assert all(m.freed for m in session.scratch)  # src and dst are freed
