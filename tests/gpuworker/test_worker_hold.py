"""The stream hold ahead of every timed run (child.Session.op_time and judge_hold), on the CPU:
the driver calls are recorded and an entrant's host time is simulated, so the order of the
queued work and the hold's adaptation can be checked without a GPU."""

from pathlib import Path

import numpy as np
import pytest

from factory.compile import compile_ptx
from gpuworker import child, gpu

KERNELS = Path(child.__file__).with_name("kernels")


def test_judge_hold_spins_on_the_global_timer_and_links_for_sm_90():
    ptx = (KERNELS / "judge.ptx").read_text()
    body = ptx.split(".entry judge_hold(")[1].split("\n}\n")[0]
    assert body.count("%globaltimer") == 2 and "nanosleep" in body and "bra" in body
    rep = compile_ptx(ptx, "sm_90")
    assert rep.ok, rep.log


class _Events:
    def __init__(self, calls):
        self.calls = calls

    def record_start(self, k, stream):
        self.calls.append(("start", k))

    def record_end(self, k, stream):
        self.calls.append(("end", k))

    def elapsed_us(self, k):
        return 50.0 + k


class _Clock:
    """The host clock op_time reads around each enqueue: it moves only when an entrant spends
    host time, so the test does not depend on how busy this machine is."""

    now = 0.0

    def __call__(self):
        return self.now


class _Entrant:
    """Spends `host_s` on the host per run (a Python baseline's dispatch) from run `slow_from`."""

    def __init__(self, clock, calls, host_s, slow_from=0):
        self.clock, self.calls, self.host_s = clock, calls, host_s
        self.slow_from, self.runs = slow_from, 0

    def prepare(self, sh):
        pass

    def run(self, sh, k):
        if self.runs >= self.slow_from:
            self.clock.now += self.host_s
        self.runs += 1
        self.calls.append(("run", k))

    def finish(self, sh, k):
        pass

    def output_ptrs(self, sh):
        return (7,)


class _Shape:
    index = 0
    sets = 2
    outputs = {}
    inputs = {}


@pytest.fixture
def session(monkeypatch):
    s = child.Session.__new__(child.Session)
    s.calls = []
    s.stream = object()
    s.nvml = None
    s.shapes = {0: _Shape()}
    s.events = _Events(s.calls)
    s.current = type("C", (), {"value": -1})()
    s.deadline = type("D", (), {"value": 0.0})()
    s.ents = {}
    s.entrant = lambda d: s.ents[d["key"]]
    s.restore_inputs = lambda *a: None
    s.zero_stats = lambda n: None
    s.poison_outputs = lambda sh: None
    s.read_stats = lambda n: np.zeros((n, child.STAT_WORDS))
    s.flush_l2 = lambda mode, r: s.calls.append(("flush", r))
    s.hold = lambda us: s.calls.append(("hold", us))
    monkeypatch.setattr(gpu, "sync", lambda *a: None)
    monkeypatch.setattr(gpu, "sm_clock_mhz", lambda h: None)
    s.clock = _Clock()
    monkeypatch.setattr(child.time, "perf_counter", s.clock)
    return s


def _time(session, msg_extra=None, **ents):
    session.ents = ents
    msg = {
        "shape": 0,
        "entrants": [{"key": k} for k in ents],
        "budget_s": 0.0,
        "timeout_s": 10,
        "check_outputs": False,
        "l2_flush": "read",
        "warmup_s": 0.0,
        "min_samples": 4,
        "max_samples": 8,
    }
    return session.op_time(msg | (msg_extra or {}))


def test_every_timed_run_is_queued_behind_a_hold_then_the_flush(session):
    reply = _time(session, ours=_Entrant(session.clock, session.calls, 0.0))
    kinds = [c[0] for c in session.calls]
    # per run: hold, flush, start event, the entrant, end event
    assert kinds[:10] == ["hold", "flush", "start", "run", "end"] * 2
    assert kinds.count("hold") == kinds.count("run") == kinds.count("start")
    got = reply["entrants"]["ours"]
    assert child.HOLD_START_US <= got["hold_us"] < 2000  # nothing here takes a millisecond
    assert got["samples_us"] and set(got["samples_us"]) <= {50.0, 51.0}


def test_a_slow_host_dispatch_raises_the_hold_before_any_run_is_recorded(session):
    # 2 ms on the host per run: the warm-up rounds double the hold past it
    reply = _time(
        session,
        torch=_Entrant(session.clock, session.calls, 0.002),
        ours=_Entrant(session.clock, session.calls, 0),
    )
    slow = reply["entrants"]["torch"]
    assert slow["hold_us"] >= 2 * 2000
    assert len(slow["samples_us"]) >= 4 and slow["host_gap_runs"] < len(slow["samples_us"])
    assert reply["entrants"]["ours"]["hold_us"] < slow["hold_us"]
    holds = [c[1] for c in session.calls if c[0] == "hold"]
    assert max(holds) == slow["hold_us"]


def test_a_run_whose_dispatch_outlasts_its_hold_is_dropped_and_counted(session):
    # fast through the warm-up (2 rounds of 2 runs), then 2 ms: the first recorded round's
    # runs may hold an idle gap: dropped, counted, and the hold raised for the rest
    e = _Entrant(session.clock, session.calls, 0.002, slow_from=4)
    reply = _time(session, torch=e)
    got = reply["entrants"]["torch"]
    assert got["host_gap_runs"] >= 1
    assert got["hold_us"] >= 4000
    assert len(got["samples_us"]) == e.runs - 4 - got["host_gap_runs"]


class _Ptx(child.PtxEntrant):
    """Our kernel's entrant as op_time sees it (a PtxEntrant), recording stage() calls."""

    def __init__(self, clock, calls, place=1000):
        self.clock, self.calls, self.place, self.staged = clock, calls, place, False

    prepare = _Entrant.prepare

    def stage(self, sh, torch, ext_stream):
        self.calls.append(("stage", torch, ext_stream))
        self.staged = True

    def output_ptrs(self, sh):
        return (self.place if self.staged else 7,)

    def run(self, sh, k):
        self.calls.append(("run", k))

    def finish(self, sh, k):
        self.calls.append(("finish", k))


class _Torch(child.TorchEntrant):
    """A torch baseline's entrant as op_time sees it, with stand-ins for torch and its stream."""

    def __init__(self, calls):
        self.calls, self.torch, self.ext_stream = calls, "torch-module", "ext-stream"

    prepare = _Entrant.prepare

    def run(self, sh, k):
        self.calls.append(("torch-run", k))

    def finish(self, sh, k):
        self.calls.append(("torch-finish", k))

    def output_ptrs(self, sh):
        return (1000,)  # where torch's allocator put its outputs


def test_beside_a_torch_baseline_our_runs_write_where_torch_allocates(session):
    reply = _time(session, ours=_Ptx(session.clock, session.calls), base=_Torch(session.calls))
    kinds = [c[0] for c in session.calls]
    # ours: staged (outputs from torch's allocator, poisoned) before the hold of every run,
    # then copied out after its end event; the baseline is never staged
    first = kinds.index("run")
    assert kinds[first - 4 : first + 3] == [
        "stage",
        "hold",
        "flush",
        "start",
        "run",
        "end",
        "finish",
    ]
    assert kinds.count("stage") == kinds.count("run") == kinds.count("finish")
    assert all(c[1:] == ("torch-module", "ext-stream") for c in session.calls if c[0] == "stage")
    assert kinds.count("torch-run") > 0
    got = reply["entrants"]
    assert got["ours"]["timed_outputs"] == got["base"]["timed_outputs"] == "torch allocator"
    assert got["ours"]["same_outputs_as_baselines"] is True
    assert got["ours"]["timed_output_places"] == got["base"]["timed_output_places"] == 1
    assert got["base"]["same_outputs_as_baselines"] is None  # said of ours only


def test_a_run_that_wrote_elsewhere_than_the_baselines_is_said_so(session):
    ours = _Ptx(session.clock, session.calls, place=2000)
    reply = _time(session, ours=ours, base=_Torch(session.calls))
    assert reply["entrants"]["ours"]["same_outputs_as_baselines"] is False


def test_without_a_torch_baseline_or_with_guarded_outputs_nothing_is_staged(session):
    reply = _time(session, ours=_Ptx(session.clock, session.calls))
    assert "stage" not in [c[0] for c in session.calls]
    assert reply["entrants"]["ours"]["timed_outputs"] == "guarded buffer"

    session.calls.clear()
    reply = _time(
        session,
        {"timed_outputs": "guarded"},
        ours=_Ptx(session.clock, session.calls),
        base=_Torch(session.calls),
    )
    assert "stage" not in [c[0] for c in session.calls]
    assert reply["entrants"]["ours"]["timed_outputs"] == "guarded buffer"
    assert reply["entrants"]["ours"]["same_outputs_as_baselines"] is None
    assert reply["entrants"]["base"]["timed_outputs"] == "torch allocator"
