"""The L2 flush before timed runs: the batch option, the judge kernel that reads the flush buffer,
the child's choice between reading and writing it, and the runner passing the choice on.

On this CPU-only host the child's CUDA calls are replaced by recorders at the driver boundary
(`gpu.memset8`, `Session._launch_judge`), and the runner talks to a stand-in child that answers
the pipe protocol; the GPU tests (test_worker_gpu.py) run the real thing."""

import copy
import re
import shutil
import subprocess
import sys
from pathlib import Path

import gpuworker_standin_child as standin
import numpy as np
import pytest

from factory.compile import compile_ptx
from gpuworker import child, gpu
from gpuworker.batch import L2_FLUSH_MODES, BatchError, Options, parse_batch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # bench/ is not an installed package
KERNELS = Path(child.__file__).with_name("kernels")


def good_batch() -> dict:
    ptx = ".version 9.0\n.target sm_90\n.address_size 64\n.visible .entry k() { ret; }\n"
    return {
        "format": 1,
        "batch_id": "b-1",
        "manifest": 'name = "softmax"\n',
        "shapes": [{"M": 16, "N": 64}],
        "candidates": [{"id": "c-1", "ptx": ptx, "entry": "k"}],
        "baselines": [],
        "options": {"time_budget_s_per_candidate": 1.0, "seed": 7},
    }


def errors_of(batch: dict) -> dict:
    with pytest.raises(BatchError) as e:
        parse_batch(batch)
    return dict(e.value.errors)


def entry_body(ptx: str, entry: str) -> str:
    start = ptx.index(f".visible .entry {entry}(")
    end = ptx.find(".visible .entry", start + 1)
    return ptx[start : end if end >= 0 else len(ptx)]


# -- the batch option -------------------------------------------------------------------------
def test_the_default_l2_flush_is_a_read():
    assert Options().l2_flush == "read"
    batch = good_batch()
    del batch["options"]
    assert parse_batch(batch).options.l2_flush == "read"
    assert parse_batch(good_batch()).options.l2_flush == "read"  # options given, flush not


@pytest.mark.parametrize("mode", ["read", "write"])
def test_both_flush_modes_are_accepted(mode):
    batch = good_batch()
    batch["options"]["l2_flush"] = mode
    opts = parse_batch(batch).options
    assert opts.l2_flush == mode
    assert opts.seed == 7  # the other options survive next to it


@pytest.mark.parametrize("bad", ["READ", "none", "", 1, None, ["read"]])
def test_an_unknown_flush_mode_is_refused_naming_the_allowed_values(bad):
    batch = good_batch()
    batch["options"]["l2_flush"] = bad
    errs = errors_of(batch)
    assert set(errs) == {"options.l2_flush"}
    assert "'read'" in errs["options.l2_flush"] and "'write'" in errs["options.l2_flush"]


# -- the judge kernel -------------------------------------------------------------------------
def test_judge_ptx_has_the_read_flush_entry_with_its_vector_loads_kept():
    ptx = (KERNELS / "judge.ptx").read_text()
    (version,) = re.findall(r"^\.version (\d+)\.(\d+)$", ptx, re.M)
    assert tuple(int(v) for v in version) <= (9, 0)  # the driver refuses PTX 9.1
    body = entry_body(ptx, "judge_read_flush")
    params = re.findall(r"\.param \.(\w+) judge_read_flush_param_\d+", body)
    assert params == ["u64", "u64", "u64"]  # (const uint4* p, long long n16, u64* sink)
    assert len(re.findall(r"ld\.global(?:\.\w+)*\.v4\.u32", body)) >= 1
    assert "atom.global.add.u64" in body  # the guarded store that keeps the loads alive
    assert "st.global" not in body  # a flush that wrote would leave dirty lines again


def test_judge_ptx_links_for_sm_90_with_nvjitlink():
    rep = compile_ptx((KERNELS / "judge.ptx").read_text(), "sm_90")
    assert rep.ok, rep.log
    assert "judge_read_flush" in rep.log  # ptxas reported the new entry's resources
    assert rep.spill_store_bytes == 0 and rep.stack_bytes == 0


def test_judge_ptx_is_what_nvcc_makes_of_judge_cu(tmp_path):
    """A judge.cu edited without regenerating judge.ptx would ship stale kernels."""
    nvcc = shutil.which("nvcc") or shutil.which("/usr/local/cuda/bin/nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on this host")
    shipped = (KERNELS / "judge.ptx").read_text()
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    made_with = re.search(r"Cuda compilation tools, release [\d.]+, V[\d.]+", shipped)
    if made_with is None or made_with.group(0) not in version:
        pytest.skip("this nvcc is not the one judge.ptx was made with")
    out = tmp_path / "judge.ptx"
    subprocess.run(
        [nvcc, "-ptx", "-arch=sm_90", str(KERNELS / "judge.cu"), "-o", str(out)],
        check=True,
        timeout=120,
    )
    assert out.read_text() == shipped


# -- the child's flush, with the driver calls recorded ----------------------------------------
class _Mem:
    def __init__(self, ptr):
        self.ptr = ptr


class _Current:
    value = 3  # as if entrant 3 had been running


@pytest.fixture
def session(monkeypatch):
    """A Session with the attributes the flush uses and its CUDA calls recorded."""
    s = child.Session.__new__(child.Session)
    s.sm_count = 132
    s.stream = object()
    s.flush = _Mem(0x7000_0000)
    s.flush_sink = _Mem(0x7F00_0000)
    s.k_read_flush = object()
    s.current = _Current()
    s.calls = []
    monkeypatch.setattr(gpu, "memset8", lambda *a: s.calls.append(("memset8", a)))
    s._launch_judge = lambda kernel, n, *args: s.calls.append(("launch", (kernel, n, args)))
    return s


def test_a_read_flush_launches_the_read_kernel_over_the_whole_buffer(session):
    session.flush_l2("read", 5)
    [(what, (kernel, n, args))] = session.calls
    assert what == "launch" and kernel is session.k_read_flush
    assert n == child.FLUSH_VECTORS and n * 16 == child.FLUSH_BYTES
    p, n16, sink = args
    assert p == session.flush.ptr and sink == session.flush_sink.ptr
    assert isinstance(n16, np.int64) and n16 == child.FLUSH_BYTES // 16  # long long, not a pointer
    # as many blocks as the judge launches get: 16 per SM, far more than one wave
    assert session._grid(n) == 16 * session.sm_count


def test_a_write_flush_fills_the_buffer_with_a_byte_that_changes_every_round(session):
    session.flush_l2("write", 0x1FF)
    assert session.calls == [
        ("memset8", (session.flush.ptr, 0xFF, child.FLUSH_BYTES, session.stream))
    ]


def test_the_child_refuses_an_unknown_flush_mode_without_blaming_an_entrant(session):
    assert session.flush_mode({}) == "read"
    assert session.flush_mode({"l2_flush": "write"}) == "write"
    with pytest.raises(ValueError, match="l2_flush"):
        session.flush_mode({"l2_flush": "sideways"})
    assert session.current.value == -1
    with pytest.raises(ValueError, match="l2_flush"):
        session.flush_l2("sideways", 0)
    assert session.calls == []


def test_every_flush_mode_the_batch_accepts_is_one_the_child_can_do(session):
    for mode in L2_FLUSH_MODES:
        session.flush_l2(mode, 1)
    assert [c[0] for c in session.calls] == ["launch", "memset8"]


# -- the runner passes the mode on and records it ---------------------------------------------
class _StandInChild:
    """Answers the child's pipe protocol as a healthy GPU would, recording every request."""

    restarts = 0
    spares_started = 0
    spare_disabled_reason = ""

    def __init__(self):
        self.requests = []
        self.restart_s = []
        self.restart_log = []

    def settle(self):
        pass

    def setup(self, msg):
        self.shapes = {s["index"]: s for s in msg["shapes"]}
        return {"ok": True, "shapes": len(self.shapes)}

    def request(self, msg):
        self.requests.append(msg)
        return standin.healthy_reply(msg, self.shapes)


@pytest.mark.parametrize("options", [{}, {"l2_flush": "write"}])
def test_the_runner_times_and_measures_the_ceiling_under_the_batch_flush(options):
    from factory.spec import load_manifest
    from gpuworker.runner import _run, _SharedArrays

    candidates = [standin.fixture_candidate("honest", "honest_bf16")]
    b = parse_batch(standin.softmax_batch("flush-1", candidates, copy.deepcopy(options)))
    want = options.get("l2_flush", "read")
    fake, shared = _StandInChild(), _SharedArrays()
    try:
        res = _run(
            b,
            load_manifest(b.manifest),
            1,
            fake,
            {"arch": "sm_90", "l2_bytes": 60 << 20},
            shared,
            "now",
            None,
        )
    finally:
        shared.close()
    sent = {m["op"]: m for m in fake.requests}
    assert sent["copy_ceiling"]["l2_flush"] == want
    assert sent["byte_mover"]["l2_flush"] == want
    # the mover at every benchmarked shape (not the held-out ones), kept in the results
    benchmarked = sorted(i for i, s in fake.shapes.items() if not s["heldout"])
    assert benchmarked
    assert sent["byte_mover"]["shapes"] == benchmarked
    assert [m["dims"] for m in res["byte_mover"]] == [fake.shapes[i]["dims"] for i in benchmarked]
    assert sent["time"]["l2_flush"] == want
    assert res["timing_protocol"] == {"l2_flush": want, "timed_outputs": "shared"}
    assert res["copy_ceiling"]["l2_flush"] == want
    assert res["copy_ceiling_tbps"] == 4.0  # the existing keys are unchanged
    assert res["candidates"][0]["status"] == "passed", res["candidates"][0]["reason"]
