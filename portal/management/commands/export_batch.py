import json

from django.core.management.base import BaseCommand, CommandError

from portal.models import GpuBatch, Job


class Command(BaseCommand):
    help = (
        "Write the GPU batch a job is waiting on as a batch file, for a GPU host that reaches no "
        "broker: run `python -m gpuworker run batch.json -o results.json` there, then "
        "`manage.py import_results results.json` here."
    )

    def add_arguments(self, parser):
        parser.add_argument("job", help="the job's code (UUID)")
        parser.add_argument("-o", "--output", default="-", help="file to write (default stdout)")

    def handle(self, *args, **opts):
        job = Job.objects.filter(code=opts["job"]).first()
        if job is None:
            raise CommandError(f"no job {opts['job']}")
        batch = job.batches.filter(status=GpuBatch.DISPATCHED).order_by("-created").first()
        if batch is None:
            raise CommandError(f"job {job.code} is not waiting on a GPU batch ({job.status})")
        text = json.dumps(batch.batch, indent=1)
        if opts["output"] == "-":
            self.stdout.write(text)
        else:
            with open(opts["output"], "w", encoding="utf-8") as fh:
                fh.write(text)
            self.stderr.write(f"wrote batch {batch.code} to {opts['output']}")
