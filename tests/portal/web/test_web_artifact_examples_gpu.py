"""The loader examples shipped in every artifact run on a real GPU and compute the right thing.

Marked `gpu`: skipped without one. Runs without Django (GPU hosts have none): the artifact
builder is loaded from its file, not through the portal package."""

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.gpu

SCALE_PTX = (ROOT / "tests" / "fixtures" / "ptx" / "scale_by_two.ptx").read_text()


def _artifacts():
    spec = importlib.util.spec_from_file_location(
        "ptxf_artifacts", ROOT / "portal" / "artifacts.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory):
    a = _artifacts()
    built = a.build_artifact(
        a.ArtifactInputs(
            workload_name="scale",
            workload_code="w",
            job_code="j",
            candidate_code="c",
            entry="scale_k",
            ptx=SCALE_PTX,
            params=[
                {"kind": "tensor", "ptx_type": "u64", "name": "x"},
                {"kind": "tensor", "ptx_type": "u64", "name": "y"},
                {"kind": "dim", "ptx_type": "u32", "name": "N"},
            ],
            launch={"grid": ["ceildiv(N, 256)", 1, 1], "block": [256, 1, 1], "smem_bytes": 0},
            shapes=[{"N": 1000}],
            inputs=[{"name": "x", "shape": ["N"], "dtype": "fp32"}],
            outputs=[{"name": "y", "shape": ["N"], "dtype": "fp32"}],
        )
    )
    folder = tmp_path_factory.mktemp("artifact")
    with zipfile.ZipFile(__import__("io").BytesIO(built.data)) as z:
        z.extractall(folder)
    # Make the examples check the kernel's answer (y = 2x), not only that it ran.
    return folder


def _run(folder, example, extra=""):
    source = (folder / example).read_text() + extra
    # Beside the original: the examples find the artifact from their own location.
    script = folder / "examples" / ("check_" + Path(example).name)
    script.write_text(source)
    return subprocess.run(
        [sys.executable, str(script.relative_to(folder))],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_cuda_python_example_loads_the_cubin_and_computes_the_output(unpacked):
    proc = _run(
        unpacked,
        "examples/load_cuda_python.py",
        "\nassert np.array_equal(y, 2 * x), 'wrong output'\nprint('checked')\n",
    )
    assert proc.returncode == 0, proc.stderr
    assert "checked" in proc.stdout


def test_the_torch_example_runs_on_torchs_stream_and_computes_the_output(unpacked):
    pytest.importorskip("torch")
    proc = _run(
        unpacked,
        "examples/load_torch.py",
        "\n    assert torch.equal(out, 2 * x), 'wrong output'\n    print('checked')\n",
    )
    assert proc.returncode == 0, proc.stderr
    assert "checked" in proc.stdout
