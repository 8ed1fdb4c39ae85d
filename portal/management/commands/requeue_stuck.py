from django.core.management.base import BaseCommand

from portal import pipeline, tasks
from portal.models import Job


class Command(BaseCommand):
    help = (
        "Send again the task of every active job that has not moved for a while. The embedded "
        "filesystem transport loses a message whose worker died (at-most-once); every task is "
        "idempotent, so a repeat is harmless. Celery beat runs this every minute in embedded mode."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--older-than", type=int, default=None, help="seconds (default: STUCK_AFTER_S)"
        )
        parser.add_argument("--gpu", action="store_true", help="also re-send GPU batches")
        parser.add_argument("--job", default=None, help="only this job (code)")

    def handle(self, *args, **opts):
        if opts["job"]:
            jobs = Job.objects.filter(code=opts["job"])
            sent = sum(pipeline.resume(job, gpu=opts["gpu"]) for job in jobs)
        elif opts["gpu"]:
            sent = 0
            for job in Job.objects.filter(status__in=Job.ACTIVE):
                sent += pipeline.resume(job, gpu=True)
        else:
            sent = tasks.requeue_stuck(opts["older_than"])
        self.stdout.write(f"re-sent {sent} task(s)")
