import os
import subprocess
import sys
import time
import urllib.request

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from portal.celery import ready_dir
from portal.management.commands.seed_demo import DEMO_USERS
from portal.management.supervise import supervise


class Command(BaseCommand):
    help = (
        "Run everything on this machine: migrate, seed the demo accounts, start the workers "
        "(start_workers) and the web server; prints the URL and the demo login. Ctrl-C stops all."
    )

    def add_arguments(self, parser):
        parser.add_argument("--addr", default=os.environ.get("PTXF_ADDR", "127.0.0.1:8000"))
        parser.add_argument("--no-workers", action="store_true")

    def handle(self, *args, **opts):
        call_command("migrate", interactive=False, verbosity=0)
        self.stdout.write("database ready")
        call_command("seed_demo", stdout=self.stdout)
        manage = [sys.executable, str(settings.BASE_DIR / "manage.py")]
        procs = []
        ready = ready_dir()
        for stale in ready.glob("*.ready"):
            stale.unlink(missing_ok=True)
        if not opts["no_workers"]:
            procs.append(subprocess.Popen([*manage, "start_workers"], cwd=settings.BASE_DIR))
        # runserver --insecure serves static files from the app and project folders without a
        # collectstatic step; production serves var/static behind a WSGI server instead.
        procs.append(
            subprocess.Popen(
                [*manage, "runserver", "--noreload", "--insecure", opts["addr"]],
                cwd=settings.BASE_DIR,
            )
        )
        url = f"http://{opts['addr']}/"
        web_up = self._wait_for(url + "accounts/login/", procs)
        if web_up and not opts["no_workers"]:
            # "Up" means a submitted job runs: wait for the CPU worker to consume its queues.
            workers = self._wait_for_workers(ready, procs)
            if workers:
                self.stdout.write(f"workers ready: {', '.join(workers)}")
            else:
                self.stdout.write(self.style.WARNING("the workers are not ready yet: jobs wait"))
        if web_up:
            username, password = DEMO_USERS[0][:2]
            self.stdout.write(self.style.SUCCESS(f"\nPTX Kernel Factory is up: {url}"))
            self.stdout.write(f"log in as {username} / {password} (customer of Acme)")
            self.stdout.write(f"engineers: {DEMO_USERS[1][0]} / {DEMO_USERS[1][1]}; Ctrl-C stops\n")
        stopping = supervise(procs, grace_s=25)
        if not stopping:
            sys.exit(1)

    def _wait_for_workers(self, ready, procs, timeout_s: float = 120.0) -> list[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not any(p.poll() is not None for p in procs):
            names = sorted(path.stem for path in ready.glob("*.ready"))
            if any(name.startswith("cpu@") for name in names):
                return names
            time.sleep(0.5)
        return []

    def _wait_for(self, url: str, procs, timeout_s: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in procs):
                return False
            try:
                with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310
                    if response.status < 500:
                        return True
            except OSError:
                time.sleep(0.5)
        return False
