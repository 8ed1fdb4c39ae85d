"""The judging side's handle on the child processes that run kernels.

Children are started with multiprocessing's spawn method (CUDA must never be initialised in a
forked process, and never in the judging process at all). `request` sends one operation to the
active child and waits for its reply while watching two things: that the child is alive (a fault
that killed it), and the deadline the child writes before every wait on the GPU (a hung kernel).
Either way the child is killed and the caller learns whose kernel was running; `restart` then
brings up a child with the same setup.

A restart used to cost a whole child start on the critical path (CUDA context, judge kernels,
the batch's inputs uploaded again: ~2.5 s on the H200). With `warm_spare` the worker keeps a
standby child that prepares itself (same setup message) while the active one works: a restart
switches to it at once and starts preparing the next one in the background. The spare only ever
talks to the judging process after it has been taken (its hello and setup replies wait in its
pipe), so it is never used by two things at once. A spare that is not ready yet is waited for;
one that failed is replaced by a cold start (and no further spares are made). Killed children are
reaped off the critical path, and `settle` waits for every background child before a timing
request, so no preparation or teardown overlaps a measurement.
"""

from __future__ import annotations

import multiprocessing as mp
import time

POLL_S = 0.02
REAP_TIMEOUT_S = 30.0


class ChildFailed(Exception):
    """The child died or hung. `kind` is "crashed" or "timeout"; `entrant_index` is the
    entrant the child was running (for multi-entrant requests), -1 when unknown."""

    def __init__(self, kind: str, reason: str, entrant_index: int = -1):
        self.kind = kind
        self.reason = reason
        self.entrant_index = entrant_index
        super().__init__(f"{kind}: {reason}")


def allow_children():
    """Let this process start our spawned children when it is a Celery prefork child.

    Celery's prefork children are daemonic, and multiprocessing refuses to start a process
    from a daemonic one; our child is killed with us (see child.py's parent watch), so lift the
    flag. And their process object is billiard's, whose authentication key refuses to be
    pickled by the standard library's spawn (it checks billiard's own spawning state), so every
    batch failed with "Pickling an AuthenticationString object is disallowed" before a child
    started: give this process the same key as the standard library's type."""
    from multiprocessing.process import AuthenticationString

    proc = mp.current_process()
    config = getattr(proc, "_config", None)
    if not isinstance(config, dict):
        return
    if config.get("daemon"):
        config["daemon"] = False
    key = config.get("authkey")
    if key is not None and type(key) is not AuthenticationString:
        config["authkey"] = AuthenticationString(bytes(key))


class _Child:
    """One child process, its pipe, and the two values it shares with us."""

    def __init__(self, ctx, target, start_timeout_s: float, name: str):
        self.deadline = ctx.Value("d", time.monotonic() + start_timeout_s, lock=False)
        self.current = ctx.Value("i", -1, lock=False)
        parent_conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(
            target=target, args=(child_conn, self.deadline, self.current), daemon=True, name=name
        )
        self.proc.start()
        child_conn.close()
        self.conn = parent_conn
        self.started_at = time.monotonic()
        self.hello: dict | None = None  # set once its hello reply has been read
        self.setup_done = False  # set once its setup reply has been read (spares)
        self.outlived_reap = False  # still there after a blocking reap (see ChildWorker._reap)

    def request(self, msg: dict) -> dict:
        self.conn.send(msg)
        return self.wait()

    def wait(self) -> dict:
        """The next reply. Raises ChildFailed (the child is then killed, not yet reaped) when
        it dies or misses its deadline."""
        eof = False
        while True:
            if eof:
                self.proc.join(POLL_S)
            elif self.conn.poll(POLL_S):
                try:
                    return self.conn.recv()
                except (EOFError, OSError):
                    # The child's end is closed: it died (while sending, or before). A closed
                    # pipe stays "readable" for poll, so remember it rather than ask again.
                    eof = True
            if not self.proc.is_alive() and (eof or not self.conn.poll(0)):
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

    def kill(self):
        """SIGKILL and close the pipe; the process is reaped later (`join`)."""
        if self.proc.is_alive():
            self.proc.kill()
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def join(self, timeout: float | None) -> bool:
        """True when the process is gone."""
        self.proc.join(timeout=timeout)
        return not self.proc.is_alive()


class ChildWorker:
    def __init__(self, start_timeout_s: float = 180.0, *, warm_spare: bool = False, target=None):
        self.ctx = mp.get_context("spawn")
        self.start_timeout_s = start_timeout_s
        self.warm_spare = warm_spare
        self.target = target  # None: gpuworker.child.child_main (tests give a stand-in)
        self.active: _Child | None = None
        self.spare: _Child | None = None
        self.dying: list[_Child] = []  # killed, not yet reaped
        self.hello: dict | None = None
        self.setup_msg: dict | None = None
        self.restarts = 0
        self.restart_s: list[float] = []
        # One dict per restart: where the new child came from and what the switch cost.
        self.restart_log: list[dict] = []
        self.spares_started = 0
        self.spare_disabled_reason = ""
        self._serial = 0

    # -- lifecycle -----------------------------------------------------------------------------
    def _spawn(self, role: str) -> _Child:
        if self.target is None:
            from gpuworker.child import child_main

            self.target = child_main
        allow_children()
        self._serial += 1
        return _Child(
            self.ctx, self.target, self.start_timeout_s, f"gpuworker-{role}-{self._serial}"
        )

    def start(self) -> dict:
        """Start a child cold (and give it the batch's setup when there is one)."""
        c = self._spawn("child")
        try:
            reply = c.wait()
        except ChildFailed:
            self._retire(c)
            self._reap(block=True)  # nothing to switch to: no hurry, leave no zombie
            raise
        if not reply.get("ok"):
            self._retire(c)
            self._reap(block=True)
            raise ChildFailed("crashed", reply.get("error", "the worker child failed to start"))
        c.hello = reply["hello"]
        self.active = c
        self.hello = c.hello
        if self.setup_msg is not None:
            self.request(self.setup_msg)
        return self.hello

    def setup(self, msg: dict) -> dict:
        """Give the active child the batch's data; a spare (when on) starts preparing the same
        data at once, in parallel."""
        self.setup_msg = msg
        self.start_spare()
        return self.request(msg)

    def start_spare(self) -> bool:
        """Start a standby child and queue the setup for it; it prepares on its own (hello, then
        setup) and nobody reads its replies until it is needed. False when spares are off, one
        exists already, or there is no setup yet."""
        if not self.warm_spare or self.spare is not None or self.setup_msg is None:
            return False
        c = self._spawn("spare")
        try:
            # Read by the child after its hello. The setup message holds locators, not data (a
            # few KB; tens at most), so it fits the socket's buffer and this does not block.
            c.conn.send(self.setup_msg)
        except OSError:
            pass  # it is gone already: found out (and replaced) when it is needed
        self.spare = c
        self.spares_started += 1
        return True

    def _make_ready(self, c: _Child):
        """Read a spare's hello and setup replies, waiting as long as it needs (under its own
        deadlines). Raises ChildFailed when it failed."""
        if c.hello is None:
            reply = c.wait()
            if not reply.get("ok"):
                raise ChildFailed("crashed", reply.get("error", "the standby child failed"))
            c.hello = reply["hello"]
        if not c.setup_done:
            reply = c.wait()
            if not reply.get("ok"):
                raise ChildFailed(
                    "crashed", f"the standby child could not take the data: {reply.get('error')}"
                )
            c.setup_done = True

    def _drop_spare(self, reason: str):
        """A spare that failed is killed, and no further spares are made this batch (a spare
        that cannot get ready once, for want of memory say, would only fail again)."""
        if self.spare is not None:
            self._retire(self.spare)
            self.spare = None
        self.warm_spare = False
        self.spare_disabled_reason = reason

    def settle(self):
        """Before a measurement: wait until no other child of ours is busy on the GPU (killed
        ones gone, the spare done preparing)."""
        self._reap(block=True)
        if self.spare is not None:
            try:
                self._make_ready(self.spare)
            except ChildFailed as e:
                self._drop_spare(e.reason)
                self._reap(block=True)

    def restart(self) -> dict:
        """Replace the active child (killed already, or killed now): by the spare when there is
        one (waiting for it if it is still preparing), else cold. Then a new spare starts."""
        t0 = time.monotonic()
        if self.active is not None:
            self._retire(self.active)
            self.active = None
        self.restarts += 1
        entry: dict = {"source": "cold"}
        if self.spare is not None:
            spare, self.spare = self.spare, None
            entry["spare_age_s"] = round(t0 - spare.started_at, 3)
            t_wait = time.monotonic()
            try:
                self._make_ready(spare)
            except ChildFailed as e:
                self.spare = spare  # so that _drop_spare retires it
                self._drop_spare(e.reason)
                entry["spare_error"] = e.reason
            else:
                self.active = spare
                self.hello = spare.hello
                entry["source"] = "warm_spare"
            entry["spare_wait_s"] = round(time.monotonic() - t_wait, 3)
        if self.active is None:
            # Cold: the killed child's memory must be free before a new one takes its data.
            self._reap(block=True)
            self.start()
        else:
            self._reap(block=False)
        self.start_spare()
        entry["switch_s"] = round(time.monotonic() - t0, 3)
        self.restart_log.append(entry)
        return self.hello

    def _retire(self, c: _Child):
        c.kill()
        self.dying.append(c)

    def _reap(self, block: bool):
        """Join killed children: waiting (a while) when `block`, else only those already gone.
        One that outlived a wait is not waited for again (a teardown stuck in the driver must
        not cost every later measurement REAP_TIMEOUT_S); `stop` still tries it once more."""
        left = []
        for c in self.dying:
            wait_s = REAP_TIMEOUT_S if block and not c.outlived_reap else 0
            if not c.join(wait_s):
                c.outlived_reap = c.outlived_reap or wait_s > 0
                left.append(c)
        self.dying = left

    def kill(self):
        """Kill every child of ours now (active and spare) and reap them."""
        if self.active is not None:
            self._retire(self.active)
            self.active = None
        if self.spare is not None:
            self._retire(self.spare)
            self.spare = None
        for c in self.dying:
            c.outlived_reap = False  # the end of the batch: one last wait for each
        self._reap(block=True)

    def stop(self):
        """End of the batch (also on errors): the active child is asked to stop, then every
        child of ours, spare included, is killed and reaped."""
        c = self.active
        if c is not None and c.conn is not None and c.proc.is_alive():
            try:
                c.conn.send({"op": "stop"})
                c.proc.join(timeout=10)
            except (OSError, BrokenPipeError):
                pass
        self.kill()

    # -- requests ------------------------------------------------------------------------------
    def request(self, msg: dict) -> dict:
        """Send one operation to the active child; return its reply dict (ok True/False).
        Raises ChildFailed when the child dies or misses its deadline (it is then killed; call
        `restart`)."""
        c = self.active
        if c is None:
            raise ChildFailed("crashed", "no worker child is running (restart it first)")
        try:
            return c.request(msg)
        except ChildFailed:
            self._retire(c)  # killed already; reaped later, off the critical path
            self.active = None
            raise
        except (OSError, BrokenPipeError) as e:
            self._retire(c)
            self.active = None
            raise ChildFailed("crashed", f"the worker process is gone ({e})") from e
