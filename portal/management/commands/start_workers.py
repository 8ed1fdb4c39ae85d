import os
import sys

from django.conf import settings
from django.core.management.base import BaseCommand

from portal.management.commands.up import requeue_after_worker_loss
from portal.management.supervise import Child, supervise
from portal.management.workers import machine_facts, worker_commands


class Command(BaseCommand):
    help = (
        "Start the Celery workers this machine should run: agents+build+default always, one GPU "
        "worker per visible GPU. Stays in the foreground; Ctrl-C stops them all."
    )

    def add_arguments(self, parser):
        parser.add_argument("--fake-gpus", type=int, default=None, help="pretend N GPUs (tests)")
        parser.add_argument("--arch", default=None, help="override the GPU architecture")
        parser.add_argument("--no-cpu", action="store_true", help="GPU workers only")
        parser.add_argument("--beat", action="store_true", help="run the periodic sweep here")
        parser.add_argument("--dry-run", action="store_true", help="print the commands only")
        parser.add_argument("--loglevel", default="info")

    def handle(self, *args, **opts):
        facts = machine_facts(fake_gpus=opts["fake_gpus"], arch=opts["arch"])
        embedded = settings.CELERY_EMBEDDED
        commands = worker_commands(
            facts,
            loglevel=opts["loglevel"],
            cpu_queues=() if opts["no_cpu"] else ("agents", "build", "default"),
            # One machine in embedded mode: the sweep that re-queues stuck work runs here.
            beat=opts["beat"] or embedded,
            embedded=embedded,
            beat_schedule_path=str(settings.VAR_DIR / "celerybeat-schedule"),
        )
        for command in commands:
            env = " ".join(f"{k}={v}" for k, v in command.env.items())
            self.stdout.write(f"{command.name}: {env} {' '.join(command.argv)}".replace("  ", " "))
        if opts["dry_run"]:
            return
        if not facts.gpu_ids:
            self.stdout.write("no GPU visible: GPU batches wait in their queue (or get imported)")
        self.stdout.flush()  # before the workers print, and before we block supervising them
        # A worker that dies is started again (portal/management/supervise.py).
        children = [
            Child(
                name=command.name,
                argv=list(command.argv),
                env={**os.environ, **command.env},
                cwd=str(settings.BASE_DIR),
            )
            for command in commands
        ]
        # Embedded, a dead worker's taken messages are gone: re-send the active jobs' tasks.
        on_restart = requeue_after_worker_loss if embedded else None
        if not supervise(children, grace_s=20, on_restart=on_restart):
            sys.exit(1)
