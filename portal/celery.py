"""The Celery app: queues, routes and broker settings.

Configuration comes from the environment here, not from Django settings, because a GPU host runs
this app without Django (it needs no database credentials): there only `gpu_run_batch` is
registered, and its results travel back through the broker to `results_record` on a portal host.

Queues: `agents` (LLM and heuristic proposal), `build` (nvJitLink on CPU), `gpu.<arch>` (one
worker process per GPU, prefork with one child), `default` (recording, bookkeeping).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from pathlib import Path

from celery import Celery
from celery.signals import worker_ready, worker_shutdown
from kombu import Queue

GPU_ARCHS = ("sm_90", "sm_100")
QUEUES = ("agents", "build", *(f"gpu.{arch}" for arch in GPU_ARCHS), "default")
GPU_TASK_NAME = "portal.gpu_run_batch"

try:
    import django  # noqa: F401 - only whether it is installed: GPU hosts run without it

    HAS_DJANGO = True
except ImportError:
    HAS_DJANGO = False
if HAS_DJANGO:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")


def var_dir() -> Path:
    return Path(os.environ.get("PTXF_VAR_DIR") or Path(__file__).resolve().parent.parent / "var")


def broker_dir() -> Path:
    return var_dir() / "broker"


def ready_dir() -> Path:
    """Where each worker of this machine leaves `<name>.ready` once it consumes its queues, so
    `manage.py up` announces the portal only when jobs can run."""
    return var_dir() / "run"


def celery_config(environ: dict[str, str] | None = None) -> dict:
    """The Celery settings for this environment (a pure function of `environ`)."""
    env = os.environ if environ is None else environ
    broker_url = env.get("CELERY_BROKER_URL", "")
    gpu_hard_limit_s = int(env.get("GPU_BATCH_TIME_LIMIT_S") or 1800)
    config = {
        "task_default_queue": "default",
        "task_queues": [Queue(name, routing_key=name) for name in QUEUES],
        "task_routes": TASK_ROUTES,
        "task_ignore_result": True,
        "result_backend": None,
        "task_serializer": "json",
        "accept_content": ["json"],
        # A task is acknowledged after it ran, so a worker killed mid-task gives it back; one
        # message at a time per process, so a long GPU batch never hoards the queue.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "worker_hijack_root_logger": False,
        "broker_connection_retry_on_startup": True,
        "task_always_eager": env.get("CELERY_TASK_ALWAYS_EAGER", "").lower() in ("1", "true"),
        "task_eager_propagates": True,
        "beat_schedule": {
            # The filesystem transport is at-most-once: a message taken by a worker that dies is
            # gone. This sweep re-sends the task for any job stuck in a stage (idempotent tasks
            # make a duplicate harmless). Harmless on Redis too.
            "requeue-stuck": {"task": "portal.requeue_stuck", "schedule": 60.0},
            # A running stage whose heartbeat stopped (its worker died or hung) is sent again
            # within a minute, or its job fails after a few tries (portal.pipeline.sweep_silent).
            "heartbeat-sweep": {"task": "portal.heartbeat_sweep", "schedule": 15.0},
        },
    }
    if broker_url:
        config["broker_url"] = broker_url
        # Longer than the longest task (a GPU batch at its hard limit), else Redis hands a
        # running task to a second worker. Unacked messages of dead workers come back on the
        # next restore sweep: the default sweep is slow (about 100 s), 1 s brings them back in
        # seconds.
        config["broker_transport_options"] = {
            "visibility_timeout": int(
                env.get("CELERY_VISIBILITY_TIMEOUT_S") or gpu_hard_limit_s + 600
            ),
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        }
    else:
        folder = broker_dir()
        config["broker_url"] = "filesystem://"
        config["broker_transport_options"] = {
            "data_folder_in": str(folder / "messages"),
            "data_folder_out": str(folder / "messages"),
            "processed_folder": str(folder / "processed"),
            "store_processed": False,
            "control_folder": str(folder / "control"),
        }
    return config


TASK_ROUTES = {
    "portal.job_start": {"queue": "default"},
    "portal.generation_propose": {"queue": "agents"},
    "portal.candidate_build": {"queue": "build"},
    "portal.gpu_batch_dispatch": {"queue": "default"},
    "portal.results_record": {"queue": "default"},
    "portal.gpu_batch_taken": {"queue": "default"},
    "portal.generation_finish": {"queue": "default"},
    "portal.requeue_stuck": {"queue": "default"},
    "portal.heartbeat_sweep": {"queue": "default"},
    "portal.gpu_batch_alive": {"queue": "default"},
    # GPU_TASK_NAME is routed per call to gpu.<arch>.
}


def make_folders() -> None:
    if not os.environ.get("CELERY_BROKER_URL"):
        for sub in ("messages", "processed", "control"):
            (broker_dir() / sub).mkdir(parents=True, exist_ok=True)


@worker_ready.connect
def _mark_ready(sender=None, **kwargs):
    folder = ready_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{sender.hostname}.ready").write_text(f"{os.getpid()}\n")


@worker_shutdown.connect
def _unmark_ready(sender=None, **kwargs):
    hostname = getattr(sender, "hostname", None)
    if hostname:
        (ready_dir() / f"{hostname}.ready").unlink(missing_ok=True)


app = Celery("portal")
app.conf.update(celery_config())
make_folders()
if HAS_DJANGO:
    app.autodiscover_tasks(["portal"])


def gpu_task_limits(environ: dict[str, str] | None = None) -> tuple[int, int]:
    """(soft, hard) time limits in seconds for a GPU batch; they only work with prefork. The
    hard limit is what stops a batch whose kernel hangs past the worker's own timeouts."""
    env = os.environ if environ is None else environ
    hard_s = int(env.get("GPU_BATCH_TIME_LIMIT_S") or 1800)
    return max(hard_s - 30, 1), hard_s


_GPU_SOFT_S, _GPU_HARD_S = gpu_task_limits()


@app.task(
    bind=True,
    name=GPU_TASK_NAME,
    acks_late=True,
    soft_time_limit=_GPU_SOFT_S,
    time_limit=_GPU_HARD_S,
    max_retries=3,
)
def gpu_run_batch(self, batch: dict) -> dict:
    """Verify and time one batch on this host's GPU; returns the results dict (CONTRACTS.md).

    Runs on a GPU host without Django. CUDA is initialised here, in the prefork child, by
    gpuworker: never in the parent, which forks children and must not hold a CUDA context.
    A host whose GPU is unusable puts the batch back on the queue for another GPU worker (a
    few times, then the job waits for `manage.py requeue_stuck --gpu` or an import).
    """
    from gpuworker import run_batch
    from gpuworker.runner import NoGpu

    worker = self.request.hostname or "gpu worker"
    _tell_portal(batch, worker)
    try:
        with _beating(batch, worker):
            return run_batch(batch)
    except NoGpu as exc:
        if self.request.retries >= (self.max_retries or 0):  # the last try: nothing follows
            _tell_portal(batch, worker, f"NoGpu: {exc} ({self.request.retries + 1} tries)")
            raise
        _tell_portal(batch, "")
        raise self.retry(exc=exc, countdown=30) from exc
    except BaseException as exc:  # a worker bug or the time limit: no results will come
        _tell_portal(batch, worker, f"{type(exc).__name__}: {exc}")
        raise


GPU_HEARTBEAT_EVERY_S = float(os.environ.get("GPU_HEARTBEAT_EVERY_S") or 20)


@contextlib.contextmanager
def _beating(batch: dict, worker: str):
    """While the batch runs, a daemon thread tells the portal every GPU_HEARTBEAT_EVERY_S
    seconds that it is alive (`portal.gpu_batch_alive`): a batch whose host died falls silent,
    and the portal's heartbeat sweep sends it again. A beat the broker refuses is skipped."""
    batch_id = batch.get("batch_id") if isinstance(batch, dict) else None
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(GPU_HEARTBEAT_EVERY_S):
            try:
                app.signature(
                    "portal.gpu_batch_alive", args=(batch_id, worker), queue="default"
                ).apply_async()
            except Exception:  # noqa: BLE001 - the next beat may land
                logging.getLogger("portal.celery").warning("heartbeat of %s not sent", batch_id)

    thread = threading.Thread(target=beat, name="gpu heartbeat", daemon=True)
    if batch_id:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if batch_id:
            thread.join(timeout=5)


def _tell_portal(batch: dict, worker: str, error: str = "") -> None:
    """Tell the portal that `worker` took `batch` (with no worker: gave it back; with an error:
    stopped without results). Only bookkeeping for the job page: a broker hiccup here must not
    cost the batch its GPU run."""
    batch_id = batch.get("batch_id") if isinstance(batch, dict) else None
    if not batch_id:
        return
    try:
        app.signature(
            "portal.gpu_batch_taken", args=(batch_id, worker, error), queue="default"
        ).apply_async()
    except Exception:  # noqa: BLE001 - see above
        logging.getLogger("portal.celery").warning("could not tell the portal about %s", batch_id)
