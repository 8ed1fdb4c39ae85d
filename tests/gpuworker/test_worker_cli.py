import json
import subprocess
import sys


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "gpuworker", *args], capture_output=True, text=True, timeout=60
    )


def test_a_malformed_batch_is_refused_with_the_field_named(tmp_path):
    path = tmp_path / "batch.json"
    path.write_text(
        json.dumps({"format": 1, "batch_id": "", "manifest": "x", "shapes": [], "candidates": []})
    )
    p = run_cli("run", str(path), "-o", str(tmp_path / "out.json"))
    assert p.returncode == 2
    assert "batch_id" in p.stderr and "shapes" in p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "out.json").exists()


def test_an_unreadable_batch_file_is_a_clean_error(tmp_path):
    p = run_cli("run", str(tmp_path / "missing.json"))
    assert p.returncode == 2 and "cannot read batch" in p.stderr


def test_importing_the_worker_starts_no_cuda_and_no_django():
    code = (
        "import sys, gpuworker, gpuworker.runner, gpuworker.child, gpuworker.baselines;"
        "bad = [m for m in sys.modules if m.startswith('django') or m == 'torch'"
        " or (m.startswith('factory.') and not m.startswith(('factory.spec', 'factory.compile')))];"
        "print(bad)"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"
