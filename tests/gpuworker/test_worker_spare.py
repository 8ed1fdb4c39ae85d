"""The warm standby child: after a hang the worker switches to a child that prepared itself in
the background, starts the next spare, and leaves no process behind, also on errors; the batch
option `warm_spare` turns it off.

On this CPU-only host the real ChildWorker and runner drive a stand-in child process
(gpuworker_standin_child.py) that speaks the child's pipe protocol and deadline contract; its
setup takes STANDIN_PREP_S seconds, so a cold start is measurably slower than a switch."""

import copy
import multiprocessing as mp
import sys
from pathlib import Path

import gpuworker_standin_child as standin
import pytest

from gpuworker import runner
from gpuworker.batch import BatchError, Options, parse_batch
from gpuworker.worker import ChildFailed, ChildWorker

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
PREP_S = 1.0
SETUP = {"op": "setup", "manifest": "", "baseline_source": None, "shapes": []}
HANG = {"op": "verify", "entrant": {"key": "candidate:hang", "entry": "infinite_loop"},
        "shapes": [], "timeout_s": 0.5}  # fmt: skip


def our_live_children() -> list:
    return [p for p in mp.active_children() if p.name.startswith("gpuworker-")]


@pytest.fixture(autouse=True)
def slow_setup(monkeypatch):
    monkeypatch.setenv("STANDIN_PREP_S", str(PREP_S))
    yield
    leftover = our_live_children()
    for p in leftover:  # a failing test must not leave processes for the next one
        p.kill()
        p.join(10)
    assert not leftover


def pid_of(worker: ChildWorker) -> int:
    return worker.request({"op": "pid"})["pid"]


def hang(worker: ChildWorker):
    with pytest.raises(ChildFailed) as e:
        worker.request(copy.deepcopy(HANG))
    assert e.value.kind == "timeout"


# -- the worker ---------------------------------------------------------------------------------
def test_a_restart_after_a_hang_switches_to_the_prepared_spare_and_starts_the_next_one():
    w = ChildWorker(warm_spare=True, target=standin.child_main)
    try:
        w.start()
        w.setup(SETUP)
        assert w.spares_started == 1 and w.spare is not None
        first = pid_of(w)
        w.settle()  # the spare prepared while the active child did its own setup
        spare_pid = w.spare.proc.pid
        hang(w)
        assert w.active is None  # killed at its deadline
        w.restart()
        (entry,) = w.restart_log
        assert entry["source"] == "warm_spare"
        assert entry["switch_s"] < PREP_S / 2  # a cold start pays the whole setup
        assert w.restart_s == []  # the runner's bookkeeping, untouched by the worker
        assert pid_of(w) == spare_pid != first
        assert w.hello["pid"] == spare_pid
        # the next spare is preparing already, in a process of its own
        assert w.spares_started == 2 and w.spare is not None
        assert w.spare.proc.pid not in (first, spare_pid) and w.spare.proc.is_alive()
    finally:
        w.stop()
    assert our_live_children() == []


def test_a_spare_still_preparing_is_waited_for_and_the_work_goes_on():
    w = ChildWorker(warm_spare=True, target=standin.child_main)
    try:
        w.start()
        w.setup(SETUP)
        w.restart()  # switch to the first spare ...
        fresh = w.spare.proc.pid
        w.restart()  # ... and at once again, to a spare that has just been started
        first, second = w.restart_log
        assert first["source"] == second["source"] == "warm_spare"
        assert second["spare_wait_s"] >= PREP_S * 0.8
        assert pid_of(w) == fresh
        assert w.request({"op": "verify", "entrant": {"key": "k", "entry": "e"}, "shapes": [],
                          "timeout_s": 5})["ok"]  # fmt: skip
    finally:
        w.stop()
    assert our_live_children() == []


def test_a_dead_spare_is_replaced_by_a_cold_start_and_no_more_spares_are_made():
    w = ChildWorker(warm_spare=True, target=standin.child_main)
    try:
        w.start()
        w.setup(SETUP)
        w.spare.proc.kill()
        w.spare.proc.join(10)
        w.restart()
        (entry,) = w.restart_log
        assert entry["source"] == "cold" and "died" in entry["spare_error"]
        assert entry["switch_s"] >= PREP_S  # the cold start re-did the setup
        assert pid_of(w) > 0
        assert w.spare is None and w.spares_started == 1 and w.spare_disabled_reason
    finally:
        w.stop()
    assert our_live_children() == []


def test_with_the_spare_off_no_spare_is_started_and_a_restart_is_cold():
    w = ChildWorker(warm_spare=False, target=standin.child_main)
    try:
        w.start()
        w.setup(SETUP)
        assert w.spare is None and w.spares_started == 0
        assert len(our_live_children()) == 1
        hang(w)
        w.restart()
        (entry,) = w.restart_log
        assert entry["source"] == "cold" and entry["switch_s"] >= PREP_S
        assert w.spare is None and w.spares_started == 0
    finally:
        w.stop()
    assert our_live_children() == []


# -- the runner ---------------------------------------------------------------------------------
_candidate = standin.fixture_candidate


def hang_batch(**options) -> dict:
    candidates = [
        _candidate("before", "honest_bf16"),
        _candidate("hang", "infinite_loop"),
        _candidate("after", "honest_bf16"),
    ]
    return standin.softmax_batch(
        "spare-1", candidates, {"seed": 3, "timeout_s_per_candidate": 0.5, **options}
    )


@pytest.fixture
def standin_runner(monkeypatch):
    made = []

    def make(**kw):
        made.append(ChildWorker(target=standin.child_main, **kw))
        return made[-1]

    monkeypatch.setattr(runner, "ChildWorker", make)
    return made


def test_the_runner_records_the_hang_and_judges_the_rest_on_the_spare(standin_runner):
    res = runner.run_batch(hang_batch())
    c = {r["id"]: r for r in res["candidates"]}
    assert c["hang"]["status"] == "timeout", c["hang"]["reason"]
    assert c["before"]["status"] == c["after"]["status"] == "passed", c["after"]["reason"]
    env = res["env"]
    assert env["warm_spare"] is True and env["worker_restarts"] == 1
    (entry,) = env["restart_log"]
    assert entry["source"] == "warm_spare"
    assert len(env["restart_s"]) == 1  # the existing key, still one figure per restart
    assert env["spares_started"] == 2 and env["spare_disabled"] is None
    # the hang cost its limit, not a cold start (which pays at least the setup again)
    assert c["hang"]["verify_wall_s"] < 0.5 + PREP_S
    (w,) = standin_runner
    assert w.active is None and w.spare is None and w.dying == []
    assert our_live_children() == []


def test_the_batch_option_turns_the_spare_off_in_the_runner(standin_runner):
    res = runner.run_batch(hang_batch(warm_spare=False))
    env = res["env"]
    assert env["warm_spare"] is False and env["spares_started"] == 0
    assert [e["source"] for e in env["restart_log"]] == ["cold"]
    assert {r["id"]: r["status"] for r in res["candidates"]}["after"] == "passed"
    (w,) = standin_runner
    assert w.warm_spare is False
    assert our_live_children() == []


def test_every_child_is_cleaned_up_when_the_batch_fails_midway(standin_runner):
    def log(msg):
        if msg.startswith("verification done"):
            assert our_live_children(), "the active child and its spare are running here"
            raise RuntimeError("the judging process failed")

    with pytest.raises(RuntimeError, match="judging process failed"):
        runner.run_batch(hang_batch(), log=log)
    (w,) = standin_runner
    assert w.spares_started == 2  # a spare existed when it failed
    assert our_live_children() == []


# -- the batch option ---------------------------------------------------------------------------
def test_the_warm_spare_option_defaults_on_and_takes_only_true_or_false():
    assert Options().warm_spare is True
    assert parse_batch(hang_batch()).options.warm_spare is True
    assert parse_batch(hang_batch(warm_spare=False)).options.warm_spare is False
    with pytest.raises(BatchError) as e:
        parse_batch(hang_batch(warm_spare="yes"))
    assert dict(e.value.errors) == {"options.warm_spare": "must be true or false"}
