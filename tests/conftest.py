"""Shared test helpers. No Django at module level: the GPU tests run on hosts without Django.

- `requires_gpu`: a skip mark for tests that need an NVIDIA GPU with a driver. Tests marked
  `@pytest.mark.gpu` are skipped the same way automatically.
- `services`-marked tests (real PostgreSQL and Redis) run only when PTXF_SERVICES=1.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest


@functools.cache
def gpu_reason() -> str:
    """Why GPU tests cannot run here ("" when they can). Asks nvidia-smi, which talks to the
    driver without creating a CUDA context in the test process."""
    if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.core") is None:
        return "cuda-core is not installed"
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA driver (nvidia-smi not found)"
    try:
        out = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi failed: {exc}"
    if "GPU " not in out:
        return "nvidia-smi lists no GPU"
    return ""


requires_gpu = pytest.mark.skipif(bool(gpu_reason()), reason=f"needs a GPU: {gpu_reason()}")


def services_available() -> bool:
    return os.environ.get("PTXF_SERVICES", "") == "1"


def pytest_collection_modifyitems(config, items):
    skip_services = pytest.mark.skip(reason="needs PostgreSQL and Redis (set PTXF_SERVICES=1)")
    for item in items:
        if "gpu" in item.keywords and gpu_reason():
            item.add_marker(pytest.mark.skip(reason=f"needs a GPU: {gpu_reason()}"))
        if "services" in item.keywords and not services_available():
            item.add_marker(skip_services)


@pytest.fixture(scope="session", autouse=True)
def _broker_folders(tmp_path_factory):
    """Where no broker is configured, the portal's Celery app uses the filesystem transport in
    the checkout's var/broker, where the tasks that tests publish (those not run eagerly) would
    wait for the next `./scripts/up` of that checkout, whose workers would then run them on its
    own jobs (ids count from 1 in both). The tests' messages go to a temporary folder."""
    celery = sys.modules.get("portal.celery")
    if celery is None or celery.app.conf.broker_url != "filesystem://":
        yield
        return
    root = tmp_path_factory.mktemp("broker")
    options = dict(celery.app.conf.broker_transport_options)
    for key, sub in [
        ("data_folder_in", "messages"),
        ("data_folder_out", "messages"),
        ("processed_folder", "processed"),
        ("control_folder", "control"),
    ]:
        (root / sub).mkdir(exist_ok=True)
        options[key] = str(root / sub)
    celery.app.conf.broker_transport_options = options
    yield


@pytest.fixture(scope="session", autouse=True)
def _compile_cache(tmp_path_factory):
    """One compile cache for the session, in a temporary directory: tests share what they
    compiled (as the portal's workers do) and leave nothing in the checkout's var/."""
    from factory.compile import configure_cache

    configure_cache(tmp_path_factory.mktemp("compile-cache"))
    yield


@pytest.fixture(scope="session")
def django_db_modify_db_settings(
    request, django_db_modify_db_settings_parallel_suffix, tmp_path_factory
):
    """A session that runs browser tests keeps its SQLite test database in a file, not in
    memory. Django's in-memory test database is one shared-cache connection pool, where SQLite
    takes table locks that fail at once ("database table is locked") instead of waiting: the
    live server's thread and the test's thread then collide whenever both touch a table, more
    often the busier the machine. A file gets the portal's own WAL and busy timeout, so one waits
    for the other as in production. Other sessions keep the faster in-memory database."""
    if not any("browser" in item.keywords for item in request.session.items):
        return
    from django.conf import settings

    for alias, db in settings.DATABASES.items():
        if db.get("ENGINE") == "django.db.backends.sqlite3":
            folder = tmp_path_factory.mktemp("sqlite")
            db.setdefault("TEST", {})["NAME"] = str(folder / f"test_{alias}.sqlite3")
