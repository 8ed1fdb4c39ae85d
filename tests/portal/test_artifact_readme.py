"""The artifact's README (what it is, install line, shapes and alignment, how to call it, the
checksums), its reference (the manifest translated back into torch ops) and its loader examples,
which refuse a wrong input with a clear message before anything is launched. The checks run on
CPU tensors; only the launch needs a GPU (marked)."""

import hashlib
import importlib.util
import io
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from factory.spec import catalogue_manifest, load_catalogue, random_inputs, reference
from factory.spec.manifest import with_pooled_dims
from portal.artifacts import ArtifactInputs, build_artifact, verify_checksums

ROOT = Path(__file__).resolve().parents[2]
SCALE_PTX = (ROOT / "tests" / "fixtures" / "ptx" / "scale_by_two.ptx").read_text()
SCALE_TOML = """name = "scale"
[inputs.x]
shape = ["N"]
dtype = "fp32"
[outputs.y]
expr = "2 * x"
dtype = "fp32"
[[shapes]]
N = 1000
"""


def _fake_compile(ptx, arch):
    return SimpleNamespace(ok=True, cubin=b"\x7fELF" + arch.encode(), registers=32)


def _tensor(t):
    return {"name": t.name, "shape": list(t.shape), "dtype": t.dtype}


def _inputs_for(w, *, ptx="// ptx\n", entry="k", manifest=None, **over) -> ArtifactInputs:
    values = dict(
        workload_name=w.name,
        workload_code="w-1",
        job_code="j-1",
        candidate_code="c-1",
        entry=entry,
        ptx=ptx,
        params=[{"kind": "tensor", "ptx_type": "u64", "name": d.name} for d in w.inputs]
        + [{"kind": "tensor", "ptx_type": "u64", "name": o.name} for o in w.outputs],
        # a block a row (M) for the row operators; over the first dim for the others
        launch={
            "grid": ["M" if "M" in w.shapes[0] else next(iter(w.shapes[0])), 1, 1],
            "block": [256, 1, 1],
            "smem_bytes": 0,
            "cluster": None,
        },
        shapes=[dict(s) for s in w.shapes],
        heldout_shapes=[dict(s) for s in w.heldout_shapes],
        inputs=[_tensor(d) for d in w.inputs],
        outputs=[_tensor(o) for o in w.outputs],
        tolerances={k: vars(v) for k, v in w.tolerance.items()},
        manifest_toml=manifest if manifest is not None else w.manifest,
        env={"gpu": "NVIDIA H200", "cuda_core": "1.2.0", "cuda_bindings": "13.3.1"},
        verification=[
            {
                "dims": dict(w.shapes[0]),
                "heldout": False,
                "passed": True,
                "rel_err": 0.0,
                "max_abs_err": 0.0,
            }
        ],  # fmt: skip
        review={"by": "eng", "at": "2026-12-07T10:00:00Z"},
    )
    values.update(over)
    return ArtifactInputs(**values)


def _unpack(built, folder: Path) -> Path:
    with zipfile.ZipFile(io.BytesIO(built.data)) as z:
        z.extractall(folder)
    return folder


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rmsnorm_artifact(tmp_path_factory):
    w = load_catalogue()["rmsnorm"]
    built = build_artifact(_inputs_for(w), compile_fn=_fake_compile)
    return w, built, _unpack(built, tmp_path_factory.mktemp("rmsnorm"))


# -- the README ------------------------------------------------------------------------------------


def test_the_zip_holds_a_readme_whose_checksums_match_the_files(rmsnorm_artifact):
    _, built, folder = rmsnorm_artifact
    assert verify_checksums(built.data) == []  # SHA256SUMS covers the README as well
    readme = (folder / "README.md").read_text()
    listed = dict(
        (path, digest)
        for digest, path in re.findall(r"^([0-9a-f]{64})  (\S+)$", readme, flags=re.M)
    )
    files = {
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and p.name not in ("README.md", "SHA256SUMS")
    }
    assert set(listed) == files
    for path, digest in listed.items():
        assert hashlib.sha256((folder / path).read_bytes()).hexdigest() == digest, path


def test_the_readme_says_what_it_is_how_to_install_and_call_it(rmsnorm_artifact):
    _, _, folder = rmsnorm_artifact
    readme = (folder / "README.md").read_text()
    assert readme.startswith("# rmsnorm: a verified PTX kernel")
    assert 'python -m pip install "cuda-core==1.2.0" "cuda-bindings==13.3.1" numpy' in readme
    assert "from load_torch import run" in readme and "out = run(x, w, dims=" in readme
    assert "examples/load_cuda_python.py" in readme and "check_input()" in readme
    assert "16-byte aligned" in readme and "contiguous" in readme
    # the supported shapes: each timed and held-out shape with its launch geometry
    assert "| M=16384 N=4096 | timed | yes | grid (16384, 1, 1)" in readme
    assert "| M=1 N=4095 | held out (never tuned for) | not recorded | grid (1, 1, 1)" in readme
    assert "| x | input | M x N | bf16 |" in readme and "| y | output | M x N | bf16 |" in readme


# -- the reference, translated back into torch ops ----------------------------------------------


# every catalogue operator, attention and cumsum included (their torch forms, and those of the
# other node kinds on the example manifests: test_artifact_forms.py)
@pytest.mark.parametrize("op", sorted(load_catalogue()))
def test_the_reference_example_matches_the_manifests_float64_reference(op, tmp_path):
    torch = pytest.importorskip("torch")
    w = load_catalogue()[op]
    built = build_artifact(_inputs_for(w), compile_fn=_fake_compile)
    folder = _unpack(built, tmp_path)
    ref_module = _module(folder / "examples" / "reference.py", f"ref_{op}")
    # small sizes of the operator's own dims (row operators: M and N, cross entropy's V; the
    # attention operators' B, H, S; a matmul's K; NCHW activations' C, W; a loss's D), and a
    # pooled axis's size derived from them
    small = {"M": 5, "N": 40, "V": 72, "B": 1, "H": 2, "S": 9, "K": 24, "C": 3, "W": 7, "D": 33}
    dims = with_pooled_dims(w.outputs, {k: small[k] for k in w.shapes[0] if k in small})
    inputs = random_inputs(w, dims, seed=3)
    expected = reference(w, inputs, dims)
    as_torch = {}
    for d in w.inputs:
        arr = inputs[d.name]
        as_torch[d.name] = (
            torch.from_numpy(arr.view(np.int16).copy()).view(torch.bfloat16)
            if d.dtype == "bf16"
            else torch.from_numpy(arr.copy())
        )
    got = ref_module.reference(as_torch)
    for o in w.outputs:
        np.testing.assert_allclose(got[o.name].numpy(), expected[o.name], rtol=1e-6, atol=1e-9)
        assert ref_module.compare(o.name, got[o.name], torch.from_numpy(expected[o.name]),
                                  ref_module.TOLERANCES[o.dtype])  # fmt: skip


def test_a_manifest_with_a_baseline_still_gets_its_reference(tmp_path):
    text = (ROOT / "factory" / "examples" / "rmsnorm_cuda.toml").read_text()
    w = load_catalogue()["rmsnorm"]
    built = build_artifact(_inputs_for(w, manifest=text), compile_fn=_fake_compile)
    with zipfile.ZipFile(io.BytesIO(built.data)) as z:
        assert "examples/reference.py" in z.namelist()
        assert "rsqrt" in z.read("examples/reference.py").decode()


def test_without_a_manifest_the_examples_skip_the_reference(tmp_path):
    w = load_catalogue()["rmsnorm"]
    built = build_artifact(_inputs_for(w, manifest=""), compile_fn=_fake_compile)
    with zipfile.ZipFile(io.BytesIO(built.data)) as z:
        names = z.namelist()
        assert "examples/reference.py" not in names and "README.md" in names
        for name in ("examples/load_torch.py", "examples/load_cuda_python.py"):
            source = z.read(name).decode()
            compile(source, name, "exec")
            assert "from reference import" not in source


def test_an_artifact_of_a_from_torch_manifest_has_the_matmul_in_its_reference(tmp_path):
    torch = pytest.importorskip("torch")
    from factory.spec import load_manifest
    from factory.torchimport import from_torch

    def linear(x, w):
        return torch.nn.functional.linear(x, w)

    w = load_manifest(from_torch(linear, torch.randn(16, 32), torch.randn(24, 32)))
    built = build_artifact(_inputs_for(w), compile_fn=_fake_compile)
    with zipfile.ZipFile(io.BytesIO(built.data)) as z:
        assert "torch.matmul(" in z.read("examples/reference.py").decode()


# -- the loader examples refuse wrong inputs, on CPU -----------------------------------------------


@pytest.fixture(scope="module")
def load_torch(rmsnorm_artifact):
    pytest.importorskip("torch")
    _, _, folder = rmsnorm_artifact
    return _module(folder / "examples" / "load_torch.py", "artifact_load_torch")


def test_every_example_is_valid_python(rmsnorm_artifact):
    _, _, folder = rmsnorm_artifact
    for path in (folder / "examples").glob("*.py"):
        compile(path.read_text(), str(path), "exec")


def test_the_torch_loader_refuses_a_wrong_dtype(load_torch):
    import torch

    dims = {"M": 4, "N": 64}
    with pytest.raises(TypeError, match=r"x must be torch.bfloat16, not torch.float32"):
        load_torch.run(torch.zeros(4, 64), torch.zeros(64, dtype=torch.bfloat16), dims)


def test_the_torch_loader_refuses_a_non_contiguous_input(load_torch):
    import torch

    x = torch.zeros(4, 128, dtype=torch.bfloat16)[:, ::2]
    with pytest.raises(ValueError, match=r"x must be contiguous \(row-major\); pass x.contiguous"):
        load_torch.run(x, torch.zeros(64, dtype=torch.bfloat16), {"M": 4, "N": 64})


def test_the_torch_loader_refuses_a_wrong_shape_and_a_cpu_tensor(load_torch):
    import torch

    w = torch.zeros(64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"x must have shape \(4, 64\)"):
        load_torch.run(torch.zeros(4, 32, dtype=torch.bfloat16), w, {"M": 4, "N": 64})
    with pytest.raises(ValueError, match=r"x must be a CUDA tensor, not on cpu"):
        load_torch.run(torch.zeros(4, 64, dtype=torch.bfloat16), w, {"M": 4, "N": 64})


def test_the_cuda_python_loader_checks_numpy_inputs(rmsnorm_artifact):
    _, _, folder = rmsnorm_artifact
    example = _module(folder / "examples" / "load_cuda_python.py", "artifact_load_cuda_python")
    dims = {"M": 4, "N": 64}
    example.check_input("x", np.zeros((4, 64), dtype=np.uint16), dims)  # bf16 bits: fine
    with pytest.raises(TypeError, match="x must be uint16, not float32"):
        example.check_input("x", np.zeros((4, 64), dtype=np.float32), dims)
    with pytest.raises(ValueError, match="must be contiguous"):
        example.check_input("x", np.zeros((4, 128), dtype=np.uint16)[:, ::2], dims)


# -- the launch itself ----------------------------------------------------------------------------


@pytest.mark.gpu
def test_on_a_gpu_both_loaders_launch_and_match_the_reference(tmp_path):
    pytest.importorskip("torch")
    from factory.spec import load_manifest

    w = load_manifest(SCALE_TOML)
    inputs = _inputs_for(
        w,
        ptx=SCALE_PTX,
        entry="scale_k",
        params=[
            {"kind": "tensor", "ptx_type": "u64", "name": "x"},
            {"kind": "tensor", "ptx_type": "u64", "name": "y"},
            {"kind": "dim", "ptx_type": "u32", "name": "N"},
        ],
        launch={"grid": ["ceildiv(N, 256)", 1, 1], "block": [256, 1, 1], "smem_bytes": 0},
    )
    folder = _unpack(build_artifact(inputs), tmp_path)
    for example in ("examples/load_torch.py", "examples/load_cuda_python.py"):
        proc = subprocess.run(
            [sys.executable, example], cwd=folder, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr
        assert "matches the reference" in proc.stdout


def test_catalogue_manifest_text_is_what_the_artifact_ships():
    w = load_catalogue()["softmax"]
    built = build_artifact(_inputs_for(w), compile_fn=_fake_compile)
    with zipfile.ZipFile(io.BytesIO(built.data)) as z:
        assert z.read("workload.toml").decode() == catalogue_manifest("softmax")
