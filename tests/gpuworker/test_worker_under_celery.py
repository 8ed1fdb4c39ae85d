"""The judging child started from a Celery prefork child, as the GPU workers of `manage.py up`
run it (billiard processes, not the standard library's)."""

import pytest

billiard = pytest.importorskip("billiard")  # Celery's process library (a test extra)


def _start_a_child(conn):
    from gpuworker.worker import ChildFailed, ChildWorker

    worker = ChildWorker(start_timeout_s=60)
    try:
        worker.start()
        conn.send("started")
        worker.stop()
    except ChildFailed as exc:
        conn.send(f"child failed: {exc.reason}")
    except Exception as exc:  # noqa: BLE001 - the test reports what went wrong
        conn.send(f"{type(exc).__name__}: {exc}")


def test_a_celery_prefork_child_starts_the_judging_child():
    # Before allow_children gave the process a standard-library key, spawning from billiard's
    # process failed with "Pickling an AuthenticationString object is disallowed", so every
    # batch sent to a GPU worker failed before it reached the GPU.
    ours, theirs = billiard.Pipe()
    proc = billiard.Process(target=_start_a_child, args=(theirs,))
    proc.daemon = True  # as Celery's pool makes them
    proc.start()
    assert ours.poll(120), "the prefork child said nothing"
    said = ours.recv()
    proc.join(30)
    # Here (no GPU) the child starts and says so; on a GPU host it starts.
    assert said == "started" or said.startswith("child failed: no GPU"), said
