"""The direction of imports (DESIGN.md): factory and gpuworker never pull in Django."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("package", ["factory", "gpuworker"])
def test_importing_the_package_does_not_import_django(package):
    code = (
        "import importlib, pkgutil, sys\n"
        f"import {package}\n"
        f"for m in pkgutil.walk_packages({package}.__path__, '{package}.'):\n"
        "    try:\n"
        "        importlib.import_module(m.name)\n"
        "    except ImportError:\n"
        "        pass  # an optional dependency (torch, triton) missing here is not our concern\n"
        "print('django' in sys.modules and sys.modules['django'] is not None)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "False", out.stderr


def test_the_gpu_side_of_the_celery_app_loads_without_django():
    # A GPU host has no Django: the Celery app must still load and know the GPU task.
    code = (
        "import sys\n"
        "sys.modules['django'] = None  # makes `import django` fail, as on a GPU host\n"
        "from portal.celery import app, GPU_TASK_NAME, HAS_DJANGO\n"
        "print(HAS_DJANGO, GPU_TASK_NAME in app.tasks, sys.modules.get('django') is not None)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "False"]
