import sys

from django.core.management.base import BaseCommand, CommandError

from portal import results_schema, services


class Command(BaseCommand):
    help = (
        "Import a results file produced on a GPU host (`python -m gpuworker run batch.json`). "
        "Importing the same file twice changes nothing."
    )

    def add_arguments(self, parser):
        parser.add_argument("path", help="the results JSON file, or - for standard input")

    def handle(self, *args, **opts):
        path = opts["path"]
        try:
            data = sys.stdin.buffer.read() if path == "-" else open(path, "rb").read()
            results = results_schema.loads(data)
        except (OSError, ValueError) as exc:
            raise CommandError(f"cannot read {path}: {exc}") from exc
        try:
            batch = services.results_import(results=results)
        except services.ResultsError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"recorded batch {batch.code} of job {batch.job.code}")
