"""Run child processes until one exits or we are told to stop, then stop them all."""

import signal
import subprocess
import time


def supervise(procs: list[subprocess.Popen], *, grace_s: float = 20.0) -> bool:
    """Wait until any child exits or SIGTERM/SIGINT arrives; then send every live child SIGTERM
    and kill those still running after `grace_s` seconds (Celery's warm shutdown needs a few).
    Returns True when we were asked to stop, False when a child exited by itself."""
    stopping = False

    def stop(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        while not stopping and all(p.poll() is None for p in procs):
            time.sleep(0.5)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
    return stopping
