"""Which Celery workers this machine runs: a pure function from machine facts to command lines,
so the policy is tested without a GPU, plus the small probes that gather the facts.

Policy:
- one CPU worker for `agents`, `build` and `default` (prefork, one child per core, at least 2);
- one GPU worker per visible GPU for `gpu.<arch>`: prefork with exactly one child (time limits
  only work with prefork, and one child means one CUDA context per GPU), prefetch 1, and
  CUDA_VISIBLE_DEVICES naming its GPU. The parent never touches CUDA; the child initialises it
  when the first batch arrives.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field


@dataclass(frozen=True)
class MachineFacts:
    cpu_count: int
    gpu_ids: tuple[str, ...]  # CUDA device ids or UUIDs as CUDA_VISIBLE_DEVICES takes them
    gpu_arch: str = "sm_90"
    hostname: str = "localhost"


@dataclass(frozen=True)
class WorkerCommand:
    name: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)  # added to the parent's environment


def worker_commands(
    facts: MachineFacts,
    *,
    python: str = sys.executable,
    loglevel: str = "info",
    cpu_queues: tuple[str, ...] = ("agents", "build", "default"),
    beat: bool = False,
    embedded: bool = False,
    beat_schedule_path: str = "",
) -> list[WorkerCommand]:
    """The worker command lines for a machine. Pure: no probing, no environment reads."""
    base = (python, "-m", "celery", "-A", "portal", "worker", "-l", loglevel)
    # The filesystem transport has no broadcast worth paying for on one machine.
    quiet = ("--without-gossip", "--without-mingle") if embedded else ()
    commands = []
    if cpu_queues:
        argv = (
            *base,
            "-n",
            f"cpu@{facts.hostname}",
            "-Q",
            ",".join(cpu_queues),
            "-P",
            "prefork",
            "-c",
            str(max(2, facts.cpu_count)),
            *quiet,
        )
        if beat:
            argv = (*argv, "-B", "-s", beat_schedule_path or "celerybeat-schedule")
        commands.append(WorkerCommand(name=f"cpu@{facts.hostname}", argv=argv))
    for index, gpu_id in enumerate(facts.gpu_ids):
        name = f"gpu{index}@{facts.hostname}"
        argv = (
            *base,
            "-n",
            name,
            "-Q",
            f"gpu.{facts.gpu_arch}",
            "-P",
            "prefork",
            "-c",
            "1",
            "--prefetch-multiplier",
            "1",
            *quiet,
        )
        commands.append(
            WorkerCommand(name=name, argv=argv, env={"CUDA_VISIBLE_DEVICES": str(gpu_id)})
        )
    return commands


def arch_from_compute_cap(cap: str) -> str:
    """ "9.0" -> "sm_90", "10.0" -> "sm_100"."""
    major, _, minor = cap.strip().partition(".")
    return f"sm_{int(major)}{int(minor or 0)}"


def probe_gpus() -> tuple[tuple[str, ...], str]:
    """(visible GPU ids, arch of the first) from `nvidia-smi`, which asks the driver without
    creating a CUDA context in this process (a forked child must never inherit one). An already
    set CUDA_VISIBLE_DEVICES limits the GPUs used. No driver: no GPUs."""
    if shutil.which("nvidia-smi") is None:
        return (), "sm_90"
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return (), "sm_90"
    rows = [line.split(",") for line in out.splitlines() if line.strip()]
    ids = [row[0].strip() for row in rows]
    arch = arch_from_compute_cap(rows[0][1]) if rows else "sm_90"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        wanted = [v.strip() for v in visible.split(",") if v.strip()]
        ids = [i for i in ids if i in wanted] if all(w.isdigit() for w in wanted) else wanted
    return tuple(ids), arch


def machine_facts(*, fake_gpus: int | None = None, arch: str | None = None) -> MachineFacts:
    if fake_gpus is not None:
        gpu_ids, found_arch = tuple(str(i) for i in range(fake_gpus)), "sm_90"
    else:
        gpu_ids, found_arch = probe_gpus()
    return MachineFacts(
        cpu_count=os.cpu_count() or 2,
        gpu_ids=gpu_ids,
        gpu_arch=arch or found_arch,
        hostname=socket.gethostname(),
    )
