"""The judging side's handle on the child process that runs kernels.

One child at a time, started with multiprocessing's spawn method (CUDA must never be initialised
in a forked process, and never in the judging process at all). `request` sends one operation and
waits for its reply while watching two things: that the child is alive (a fault that killed it),
and the deadline the child writes before every wait on the GPU (a hung kernel). Either way the
child is killed and the caller learns whose kernel was running; `restart` brings up a fresh one
with the same setup.
"""

from __future__ import annotations

import multiprocessing as mp
import time

POLL_S = 0.02


class ChildFailed(Exception):
    """The child died or hung. `kind` is "crashed" or "timeout"; `entrant_index` is the
    entrant the child was running (for multi-entrant requests), -1 when unknown."""

    def __init__(self, kind: str, reason: str, entrant_index: int = -1):
        self.kind = kind
        self.reason = reason
        self.entrant_index = entrant_index
        super().__init__(f"{kind}: {reason}")


def allow_children():
    """Celery's prefork children are daemonic, and multiprocessing refuses to start a process
    from a daemonic one. Our child is killed with us (see child.py's parent watch), so lift the
    flag for this process."""
    proc = mp.current_process()
    if getattr(proc, "_config", {}).get("daemon"):
        proc._config["daemon"] = False


class ChildWorker:
    def __init__(self, start_timeout_s: float = 180.0):
        self.ctx = mp.get_context("spawn")
        self.start_timeout_s = start_timeout_s
        self.proc = None
        self.conn = None
        self.hello: dict | None = None
        self.setup_msg: dict | None = None
        self.restarts = 0
        self.restart_s: list[float] = []

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> dict:
        from gpuworker.child import child_main

        allow_children()
        self.deadline = self.ctx.Value("d", time.monotonic() + self.start_timeout_s, lock=False)
        self.current = self.ctx.Value("i", -1, lock=False)
        parent_conn, child_conn = self.ctx.Pipe()
        self.proc = self.ctx.Process(
            target=child_main, args=(child_conn, self.deadline, self.current), daemon=True
        )
        self.proc.start()
        child_conn.close()
        self.conn = parent_conn
        reply = self._wait()
        if not reply.get("ok"):
            self.stop()
            raise ChildFailed("crashed", reply.get("error", "the worker child failed to start"))
        self.hello = reply["hello"]
        if self.setup_msg is not None:
            self.request(self.setup_msg)
        return self.hello

    def setup(self, msg: dict) -> dict:
        self.setup_msg = msg
        return self.request(msg)

    def restart(self) -> dict:
        self.kill()
        self.restarts += 1
        return self.start()

    def kill(self):
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
        if self.proc is not None:
            self.proc.join(timeout=30)
        if self.conn is not None:
            self.conn.close()
        self.proc = None
        self.conn = None

    def stop(self):
        if self.proc is not None and self.proc.is_alive():
            try:
                self.conn.send({"op": "stop"})
                self.proc.join(timeout=10)
            except (OSError, BrokenPipeError):
                pass
        self.kill()

    # -- requests ------------------------------------------------------------------------------
    def request(self, msg: dict) -> dict:
        """Send one operation; return the child's reply dict (ok True/False). Raises ChildFailed
        when the child dies or misses its deadline (it is then killed; call `restart`)."""
        self.conn.send(msg)
        return self._wait()

    def _wait(self) -> dict:
        while True:
            if self.conn.poll(POLL_S):
                try:
                    return self.conn.recv()
                except (EOFError, OSError):
                    pass  # the child died while sending: handled as a crash below
            if not self.proc.is_alive() and not self.conn.poll(0):
                code = self.proc.exitcode
                who = self.current.value
                self.kill()
                raise ChildFailed("crashed", f"the worker process died (exit code {code})", who)
            if time.monotonic() > self.deadline.value:
                who = self.current.value
                late = time.monotonic() - self.deadline.value
                self.kill()
                raise ChildFailed(
                    "timeout",
                    f"no progress before its deadline (killed {late:.1f} s after it)",
                    who,
                )
