"""Pipeline stages for the tests, named through the FACTORY_* settings (a worker subprocess
takes them from its environment). They wrap the real stages and only add what a test needs to
observe: a line in a marker file per call, and a pause on the first call so a test can kill the
worker mid-task."""

from __future__ import annotations

import os
import time


def slow_review(draft, compile_report):
    marker = os.environ["PTXF_TEST_MARKER"]
    with open(marker, "a", encoding="utf-8") as fh:
        fh.write(f"start {os.getpid()}\n")
    with open(marker, encoding="utf-8") as fh:
        first_call = len(fh.read().splitlines()) == 1
    if first_call:
        time.sleep(float(os.environ.get("PTXF_TEST_PAUSE_S", "30")))
    from factory.agents.review import review

    return review(draft, compile_report)


def failing_propose(workload, **kwargs):
    raise RuntimeError("the model is unavailable")
