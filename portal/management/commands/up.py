import os
import sys
import time
import urllib.error
import urllib.request

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from portal.celery import ready_dir
from portal.management.commands.seed_demo import (
    DEMO_USERS,
    demo_accounts_create,
    demo_accounts_disable,
)
from portal.management.supervise import Child, supervise
from portal.management.workers import machine_facts, worker_commands


def web_server_argv(addr: str, *, production: bool) -> list[str]:
    """runserver for a try-out; gunicorn (WhiteNoise serves the static files) in production."""
    if not production:
        # runserver --insecure serves static files from the app and project folders without
        # a collectstatic step.
        return [sys.executable, "manage.py", "runserver", "--noreload", "--insecure", addr]
    workers = os.environ.get("WEB_CONCURRENCY") or str(min(8, 2 * (os.cpu_count() or 1) + 1))
    return [
        sys.executable,
        "-m",
        "gunicorn",
        "portal.wsgi:application",
        "--bind",
        addr,
        "--workers",
        workers,
        "--threads",
        os.environ.get("WEB_THREADS", "4"),
        "--timeout",
        os.environ.get("WEB_TIMEOUT_S", "60"),
        "--graceful-timeout",
        "20",
        "--access-logfile",
        "-",
    ]


def requeue_after_worker_loss(child: Child) -> None:
    """A worker died: the embedded broker does not give back what it had taken, so every active
    job is sent again at once (each task is idempotent; duplicates cost a little work). A GPU
    batch is not: its worker reports it lost (`gpu_batch_taken` with an error)."""
    if not child.name.startswith("cpu@"):
        return
    from portal import tasks

    try:
        sent = tasks.requeue_stuck(older_than_s=1)
    except Exception as exc:  # noqa: BLE001 - the next sweep tries again
        print(f"up: re-sending after {child.name} died failed: {exc}", file=sys.stderr)
    else:
        print(f"up: after {child.name}: re-sent {sent} task(s) of active jobs", file=sys.stderr)


class Command(BaseCommand):
    help = (
        "Run everything on this machine: migrate, create the demo accounts (embedded default "
        "only), start the workers and the web server (gunicorn with --production); prints the "
        "URL. A worker or web server that dies is started again; Ctrl-C stops all."
    )

    def add_arguments(self, parser):
        parser.add_argument("--addr", default=os.environ.get("PTXF_ADDR", "127.0.0.1:8000"))
        parser.add_argument("--no-workers", action="store_true")
        parser.add_argument(
            "--production",
            action="store_true",
            help="serve with gunicorn (static files by WhiteNoise after collectstatic)",
        )
        parser.add_argument("--fake-gpus", type=int, default=None, help=argparse_hidden())

    def handle(self, *args, **opts):
        call_command("migrate", interactive=False, verbosity=0)
        self.stdout.write("database ready")
        if settings.DEMO_ACCOUNTS:
            demo_accounts_create()
            from portal.demo_example import demo_example_seed  # the finished example (issue 52)

            demo_example_seed()
        elif demo_accounts_disable():
            self.stdout.write("demo accounts disabled (not the embedded default)")
        if opts["production"]:
            call_command("collectstatic", interactive=False, verbosity=0)
            self.stdout.write(f"static files collected in {settings.STATIC_ROOT}")
        children = []
        ready = ready_dir()
        for stale in ready.glob("*.ready"):
            stale.unlink(missing_ok=True)
        if not opts["no_workers"]:
            facts = machine_facts(fake_gpus=opts["fake_gpus"])
            embedded = settings.CELERY_EMBEDDED
            for command in worker_commands(
                facts,
                beat=embedded,
                embedded=embedded,
                beat_schedule_path=str(settings.VAR_DIR / "celerybeat-schedule"),
            ):
                children.append(
                    Child(
                        name=command.name,
                        argv=list(command.argv),
                        env={**os.environ, **command.env},
                        cwd=str(settings.BASE_DIR),
                    )
                )
        web = Child(
            name="web",
            argv=web_server_argv(opts["addr"], production=opts["production"]),
            cwd=str(settings.BASE_DIR),
        )
        children.append(web)
        for child in children:
            child.start()
        url = f"http://{opts['addr']}/"
        web_up = self._wait_for(url + "accounts/login/", web)
        if web_up and not opts["no_workers"]:
            # "Up" means a submitted job runs: wait for the CPU worker to consume its queues.
            workers = self._wait_for_workers(ready, children)
            if workers:
                self.stdout.write(f"workers ready: {', '.join(workers)}")
                if settings.CELERY_EMBEDDED:
                    # A previous run that died took its workers' in-flight messages with it
                    # (the embedded broker is at-most-once): send the active jobs' tasks again.
                    requeue_after_worker_loss(Child(name="cpu@previous-run", argv=[]))
            else:
                self.stdout.write(self.style.WARNING("the workers are not ready yet: jobs wait"))
        if web_up:
            self.stdout.write(self.style.SUCCESS(f"\nPTX Kernel Factory is up: {url}"))
            if settings.DEMO_ACCOUNTS:
                username, password = DEMO_USERS[0][:2]
                self.stdout.write(f"log in as {username} / {password} (customer and admin of Acme)")
                self.stdout.write(f"engineers: {DEMO_USERS[1][0]} / {DEMO_USERS[1][1]}")
            self.stdout.write("Ctrl-C stops everything\n")
        self.stdout.flush()
        supervise(children, grace_s=25, on_restart=requeue_after_worker_loss)

    def _wait_for_workers(self, ready, children, timeout_s: float = 120.0) -> list[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            names = sorted(path.stem for path in ready.glob("*.ready"))
            if any(name.startswith("cpu@") for name in names):
                return names
            time.sleep(0.5)
        return []

    def _wait_for(self, url: str, web: Child, timeout_s: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not web.alive():
                return False
            try:
                with _NO_REDIRECTS.open(url, timeout=2) as response:
                    if response.status < 500:
                        return True
            except urllib.error.HTTPError as exc:
                # a redirect to https (PRODUCTION) or a refusal still means it answers
                if exc.code < 500:
                    return True
                time.sleep(0.5)
            except OSError:
                time.sleep(0.5)
        return False


class _KeepRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # report the redirect instead of following it


_NO_REDIRECTS = urllib.request.build_opener(_KeepRedirects)


def argparse_hidden():
    import argparse

    return argparse.SUPPRESS
