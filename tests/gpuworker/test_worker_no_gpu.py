import json
import shutil
import subprocess
import sys

import pytest

# nvidia-smi talks to the driver without creating a CUDA context in this process.
pytestmark = pytest.mark.skipif(
    shutil.which("nvidia-smi") is not None, reason="this host has a GPU"
)


def test_probe_reports_no_gpu_cleanly_without_a_traceback():
    p = subprocess.run(
        [sys.executable, "-m", "gpuworker", "probe"], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0
    assert "Traceback" not in p.stdout + p.stderr
    assert p.stdout.startswith("no GPU")
    report = json.loads(p.stdout.split("\n", 1)[1])
    assert report["gpu"] is None and report["cuda_core"]


def test_the_worker_child_says_no_gpu_instead_of_crashing():
    from gpuworker.worker import ChildFailed, ChildWorker

    with pytest.raises(ChildFailed) as e:
        ChildWorker(start_timeout_s=60).start()
    assert e.value.kind == "crashed" and e.value.reason.startswith("no GPU")
