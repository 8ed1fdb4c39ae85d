"""Run child processes, restart the ones that die, and stop them all when told to.

A child that exits by itself (a worker killed by the OOM killer, a crash) is started again after
a back-off (1 s, doubling to `backoff_max_s`, back to 1 s once it has run a minute), and
`on_restart(child)` is called so the caller can re-send work the dead child may have taken (the
embedded broker is at-most-once). SIGTERM or SIGINT stops everything: each live child gets
SIGTERM, and those still running after `grace_s` seconds are killed.

Every child is started with PR_SET_PDEATHSIG (Linux): if the supervisor itself is killed, the
kernel sends its children SIGTERM, so no worker or compiler outlives it. Each child leads a
process group of its own, killed whole once the child has died or stopped, so what it forked
(a Celery worker's pool children, its beat) does not live on as an orphan.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

PR_SET_PDEATHSIG = 1
HEALTHY_AFTER_S = 60.0


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """In a child before exec: ask the kernel for `sig` when the parent dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str] | None = None  # the whole environment (None: ours)
    cwd: str | None = None
    restart: bool = True
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    restarts: int = 0
    backoff_s: float = 1.0
    due_at: float | None = None  # when a dead child is started again
    parent_of_group: bool = False  # started here, in a process group of its own

    def start(self) -> None:
        parent = os.getpid()

        def preexec():  # runs in the child between fork and exec
            die_with_parent()
            if os.getppid() != parent:  # the parent died before prctl took effect
                os._exit(1)

        # Its own process group: when it dies, whatever it forked (a Celery worker's pool
        # children and beat) is killed with the group instead of living on as orphans.
        self.proc = subprocess.Popen(
            self.argv, env=self.env, cwd=self.cwd, preexec_fn=preexec, process_group=0
        )
        self.started_at = time.monotonic()
        self.due_at = None
        self.parent_of_group = True

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        """Signal what is left of the child's process group (its own forks)."""
        if self.proc is None or self.proc.pid is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def as_children(procs) -> list[Child]:
    """Popen objects (already started, not restarted) or Child specs, as Child objects."""
    out = []
    for p in procs:
        if isinstance(p, Child):
            out.append(p)
        else:
            child = Child(name=f"pid {p.pid}", argv=list(p.args), restart=False, proc=p)
            child.started_at = time.monotonic()
            out.append(child)
    return out


def supervise(
    procs,
    *,
    grace_s: float = 20.0,
    backoff_max_s: float = 30.0,
    on_restart: Callable[[Child], None] | None = None,
    log: Callable[[str], None] | None = None,
    poll_s: float = 0.2,
) -> bool:
    """Supervise `procs` (Child specs, started here if not yet; or Popen objects, never
    restarted) until SIGTERM/SIGINT, or until a child that may not be restarted exits. Returns
    True when we were asked to stop, False when a child ended the supervision."""
    children = as_children(procs)
    say = log or (lambda text: print(text, file=sys.stderr, flush=True))
    stopping = False

    def stop(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    ended_by_child = False
    try:
        for child in children:
            if child.proc is None:
                child.start()
        while not stopping:
            now = time.monotonic()
            for child in children:
                if child.due_at is not None:
                    if now >= child.due_at:
                        child.restarts += 1
                        say(f"supervise: starting {child.name} again (restart {child.restarts})")
                        child.start()
                        if on_restart is not None:
                            on_restart(child)
                    continue
                if child.alive():
                    if now - child.started_at > HEALTHY_AFTER_S:
                        child.backoff_s = 1.0
                    continue
                code = child.proc.returncode if child.proc else None
                if child.parent_of_group:
                    child.kill_group()  # its orphans (pool children, beat) go with it
                if not child.restart:
                    say(f"supervise: {child.name} exited ({code}); stopping the others")
                    ended_by_child = True
                    break
                say(f"supervise: {child.name} exited ({code}); restart in {child.backoff_s:.0f} s")
                child.due_at = now + child.backoff_s
                child.backoff_s = min(backoff_max_s, child.backoff_s * 2)
            if ended_by_child:
                break
            time.sleep(poll_s)
    finally:
        live = [c for c in children if c.alive()]
        for c in live:
            c.proc.send_signal(signal.SIGTERM)  # Celery's warm shutdown stops its own pool
        deadline = time.monotonic() + grace_s
        for c in live:
            try:
                c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait()
        for c in children:
            if c.parent_of_group:
                c.kill_group()
    return stopping
