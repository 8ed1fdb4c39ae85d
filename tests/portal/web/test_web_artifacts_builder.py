"""The artifact zip is built from plain data, compiles a cubin per architecture with the real
nvJitLink, and every file is covered by SHA256SUMS."""

import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest

from portal.artifacts import ArtifactInputs, build_artifact, launch_for_shape, verify_checksums

SCALE_PTX = (
    Path(__file__).resolve().parents[2] / "fixtures" / "ptx" / "scale_by_two.ptx"
).read_text()


def _inputs(**overrides):
    timing = {
        "dims": {"N": 4096},
        "median_us": 2.0,
        "p20_us": 1.9,
        "p80_us": 2.1,
        "ci_low_us": 1.95,
        "ci_high_us": 2.05,
        "samples_us": [2.0, 1.9, 2.1],
        "bytes": 32768,
        "tbps": 0.016,
        "sm_clock_mhz": 1980,
    }
    values = dict(
        workload_name="scale",
        workload_code="w-1",
        job_code="j-1",
        candidate_code="c-1",
        entry="scale_k",
        ptx=SCALE_PTX,
        params=[
            {"kind": "tensor", "ptx_type": "u64", "name": "x"},
            {"kind": "tensor", "ptx_type": "u64", "name": "y"},
            {"kind": "dim", "ptx_type": "u32", "name": "N"},
        ],
        launch={"grid": [16, 1, 1], "block": [256, 1, 1], "smem_bytes": 0, "cluster": None},
        shapes=[{"N": 4096}],
        heldout_shapes=[{"N": 4095}],
        inputs=[{"name": "x", "shape": ["N"], "dtype": "fp32"}],
        outputs=[{"name": "y", "shape": ["N"], "dtype": "fp32"}],
        tolerances={"fp32": {"rel_norm": 1e-5, "atol": 1e-6, "rtol": 1e-5}},
        manifest_toml='name = "scale"\n',
        env={"gpu": "NVIDIA H200", "driver": "580.159.04", "nvjitlink": "13.0.88"},
        harness_version="gpuworker 1",
        verification=[
            {
                "dims": {"N": 4096},
                "heldout": False,
                "passed": True,
                "rel_err": 0.0,
                "max_abs_err": 0.0,
                "reason": "",
            }
        ],
        timing=[timing],
        baselines=[
            {
                "name": "torch_eager",
                "status": "passed",
                "timing": [{**timing, "median_us": 5.0, "ci_low_us": 4.9, "ci_high_us": 5.1}],
            }
        ],
        review={"by": "eng", "at": "2026-12-02T10:00:00Z", "comment": "clean"},
    )
    values.update(overrides)
    return ArtifactInputs(**values)


@pytest.fixture(scope="module")
def built():
    return build_artifact(_inputs(), created_at="2026-12-02T10:00:00Z")


def test_every_file_in_the_zip_is_listed_in_sha256sums_and_matches(built):
    assert verify_checksums(built.data) == []
    with zipfile.ZipFile(io.BytesIO(built.data)) as z:
        names = set(z.namelist())
    assert {
        "kernel.ptx",
        "cubin/sm_90.cubin",
        "manifest.json",
        "report/report.json",
        "report/REPORT.md",
        "examples/load_cuda_python.py",
        "examples/load_torch.py",
        "SHA256SUMS",
        "workload.toml",
    } <= names


def test_a_cubin_is_built_for_hopper_and_for_blackwell_when_it_compiles(built):
    assert built.cubins["sm_90"]["ok"] and built.cubins["sm_100"]["ok"]
    with zipfile.ZipFile(io.BytesIO(built.data)) as z:
        assert z.read("cubin/sm_90.cubin")[:4] == b"\x7fELF"


def test_the_manifest_names_the_entry_params_geometry_per_shape_and_versions(built):
    with zipfile.ZipFile(io.BytesIO(built.data)) as z:
        manifest = json.loads(z.read("manifest.json"))
        ptx = z.read("kernel.ptx")
    assert manifest["entry"] == "scale_k"
    assert [p["name"] for p in manifest["params"]] == ["x", "y", "N"]
    assert manifest["launch_per_shape"][0]["grid"] == [16, 1, 1]
    assert manifest["launch_heldout_shapes"][0]["dims"] == {"N": 4095}
    assert manifest["versions"]["driver"] == "580.159.04"
    assert manifest["versions"]["harness"] == "gpuworker 1"
    assert manifest["ptx"]["sha256"] == hashlib.sha256(ptx).hexdigest()
    assert manifest["tolerances"]["fp32"]["rel_norm"] == 1e-5


def test_the_report_keeps_raw_samples_and_the_speedup_against_each_baseline(built):
    with zipfile.ZipFile(io.BytesIO(built.data)) as z:
        report = json.loads(z.read("report/report.json"))
        markdown = z.read("report/REPORT.md").decode()
    assert report["timing"][0]["samples_us"] == [2.0, 1.9, 2.1]
    (speedup,) = report["speedups"]
    assert speedup["baseline"] == "torch_eager" and speedup["speedup"] == 2.5
    assert speedup["speedup_low"] == pytest.approx(4.9 / 2.05)
    assert "2.50×" in markdown


def test_the_loader_examples_are_valid_python_naming_the_entry(built):
    with zipfile.ZipFile(io.BytesIO(built.data)) as z:
        for name in ("examples/load_cuda_python.py", "examples/load_torch.py"):
            source = z.read(name).decode()
            compile(source, name, "exec")
            assert "scale_k" in source


def test_the_same_evidence_gives_the_same_bytes(built):
    again = build_artifact(_inputs(), created_at="2026-12-02T10:00:00Z")
    assert again.sha256 == built.sha256


def test_a_tampered_file_is_caught_by_the_checksums(built):
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(built.data)) as src, zipfile.ZipFile(out, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            dst.writestr(item, data + b"\n" if item.filename == "kernel.ptx" else data)
    assert verify_checksums(out.getvalue()) == ["kernel.ptx: checksum mismatch"]


def test_ptx_that_does_not_compile_for_its_target_builds_no_artifact():
    with pytest.raises(ValueError, match="does not compile"):
        build_artifact(_inputs(ptx=".version 8.8\n.target sm_90\nnonsense"))


def test_launch_geometry_accepts_plain_integers_without_the_expression_evaluator():
    launch = {"grid": [4, 2, 1], "block": [128, 1, 1], "smem_bytes": 1024, "cluster": [2, 1, 1]}
    assert launch_for_shape(launch, {"N": 1}) == {
        "dims": {"N": 1},
        "grid": [4, 2, 1],
        "block": [128, 1, 1],
        "smem_bytes": 1024,
        "cluster": [2, 1, 1],
    }
