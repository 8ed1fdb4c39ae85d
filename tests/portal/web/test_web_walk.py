"""Issue 52, done when: a new customer's first hour, walked in Chromium from a PyTorch file to a
downloaded artifact whose loader is checked on the CPU.

1. `ptxf import` (a subprocess, as on the customer's machine) translates a PyTorch softmax into
   a manifest file;
2. the customer uploads that file on the New workload page, with the page's defaults; the
   factory plans, writes and compiles a generation (eagerly, in the request);
3. an engineer downloads the job's GPU batch and brings back a results file for exactly that
   batch's kernels (each entry carries the sha256 of the PTX it ran, which the portal checks);
4. the engineer reviews and approves; the customer downloads the artifact;
5. on the CPU: the zip's checksums, the PyTorch loader's input checks (dtype, shape,
   contiguity, device), the artifact's float64 reference against the customer's own PyTorch
   function, and the approved kernel itself (kernel.ptx, run by the CPU PTX interpreter)
   against that PyTorch function.

What stands in for the GPU, and why. There is no GPU here, and a recording made on an H200
cannot be of this job's kernels (the generator changes; the hashes would not match). So the
batch's checks run on the CPU PTX interpreter (factory.ptxsim): every candidate is run at
every benchmarked and held-out shape on fresh inputs drawn as the judge draws them and
compared with the manifest's float64 reference under its tolerances: real verification, of
exactly these kernels. The interpreter cannot time a GPU: the "timings" in the results file
are the interpreter's own wall-clock times (tens of milliseconds), and the file's `env` names
the interpreter and no GPU, which the candidate page repeats ("Measured on ..."). No baseline
can run without a GPU: each asked-for baseline is reported unavailable, so the review's
"faster than the baselines" check cannot pass and the engineer approves with a recorded
override. The shapes are small (8 and 16 rows of 256) because the interpreter runs every
thread one instruction at a time.

Screenshots of every page, at 1280 px and 390 px wide, go to test-artifacts/walk/
(git-ignored); every page is also checked to fit a 390 px screen.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import platform
import statistics
import subprocess
import sys
import time
import zipfile
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tests.browser.conftest import (  # noqa: F401 - fixtures of the browser tests
    ARTIFACTS,
    CHROMIUM,
    _orm_beside_playwright,
    browser,
    log_in,
    new_page,
)

ROOT = Path(__file__).resolve().parents[3]
SHOTS = ARTIFACTS / "walk"
PHONE = 390

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    # The walk photographs some twenty pages at two widths and runs the CPU interpreter over a
    # batch: about 2 minutes alone on 2 cores, 5 or more on a loaded machine (the suite's 300 s
    # cap failed it there while every step was still going on).
    pytest.mark.timeout(900),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing"),
]

# The customer's own code: what `ptxf import` traces on their machine.
CUSTOMER_MODEL = '''\
import torch


def softmax(x):
    """Our attention's row softmax: bf16 in and out, computed in fp32."""
    return torch.softmax(x.float(), dim=-1).to(torch.bfloat16)
'''

# The interpreter's stand-in for a GPU, named wherever the results file says where it ran.
CPU_ENV_GPU = "CPU PTX interpreter factory.ptxsim, no GPU"
NO_GPU_REASON = "no GPU: the CPU PTX interpreter runs the candidates' PTX only"


# --- the GPU stage's checks, on the CPU -----------------------------------------------------------


def _emitted(ptx: str, params: list[dict], launch: dict):
    """What factory.ptxsim.run_kernel launches, from a batch entry's (or artifact's) fields."""
    return SimpleNamespace(
        ptx=ptx,
        params=[SimpleNamespace(kind=p["kind"], name=p["name"]) for p in params],
        launch=SimpleNamespace(
            grid=launch["grid"], block=launch["block"], cluster=launch.get("cluster")
        ),
    )


def _run_on_cpu(spec, em, dims: dict, inputs: dict) -> dict[str, np.ndarray]:
    """The kernel's outputs (float64) at `dims` on `inputs` (storage form), by the interpreter;
    outputs start as NaN bit patterns so an element the kernel never writes shows."""
    from factory.ptxsim import run_kernel
    from factory.spec import to_float64
    from factory.spec.reference import STORAGE_DTYPES, concrete_shape

    arrays = dict(inputs)
    for o in spec.outputs:
        storage = STORAGE_DTYPES[o.dtype]
        shape = concrete_shape(o.shape, dims)
        arrays[o.name] = (
            np.full(shape, np.nan, dtype=np.float32)
            if storage == np.float32
            else np.full(shape, 0xFFFF, dtype=np.uint16).view(storage)
        )
    out = run_kernel(em, dims, arrays)
    return {
        o.name: to_float64(
            np.frombuffer(out[o.name], dtype=arrays[o.name].dtype).reshape(arrays[o.name].shape),
            o.dtype,
        )
        for o in spec.outputs
    }


def _verdict(spec, got: dict, want: dict) -> tuple[bool, float, float, str]:
    """The judge's rule per output: finite, relative norm error within rel_norm, every element
    within atol + rtol * |ref|. (passed, worst rel_err, worst max_abs_err, reason)."""
    passed, rel_worst, abs_worst, reasons = True, 0.0, 0.0, []
    for o in spec.outputs:
        g, w = got[o.name], np.asarray(want[o.name], dtype=np.float64).reshape(got[o.name].shape)
        tol = spec.tolerance[o.dtype]
        err = np.abs(g - w)
        rel = float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30))
        bad = int((~(err <= tol.atol + tol.rtol * np.abs(w))).sum())
        finite = bool(np.isfinite(g).all())
        rel_worst = max(rel_worst, rel if np.isfinite(rel) else 1e30)
        abs_worst = max(abs_worst, float(np.nanmax(err)) if finite else 1e30)
        if not finite or rel > tol.rel_norm or bad:
            passed = False
            reasons.append(f"{o.name}: rel_err {rel:.2e}, {bad} elements out of bounds")
    return passed, rel_worst, abs_worst, "; ".join(reasons)


def cpu_stage(batch: dict, repeats: int = 3) -> dict:
    """A results file (docs/CONTRACTS.md, format 1) for `batch`, made on the CPU: every
    candidate verified by the interpreter at every shape and held-out shape, and "timed" as
    the interpreter's wall-clock time at each benchmarked shape (the env says so)."""
    from factory.spec import load_manifest, random_inputs, reference

    spec = load_manifest(batch["manifest"])
    started = datetime.now(UTC).isoformat(timespec="seconds")
    entries = []
    for n, c in enumerate(batch["candidates"]):
        em = _emitted(c["ptx"], c["params"], c["launch"])
        verification, timing, problems = [], [], []
        for heldout, shapes in ((False, batch["shapes"]), (True, batch["heldout_shapes"])):
            for k, dims in enumerate(shapes):
                inputs = random_inputs(spec, dims, seed=1000 * n + 10 * k + heldout)
                try:
                    got = _run_on_cpu(spec, em, dims, inputs)
                except Exception as exc:  # noqa: BLE001 - a crash is this shape's verdict
                    ok, rel, mx, why = False, None, None, f"{type(exc).__name__}: {exc}"[:300]
                else:
                    ok, rel, mx, why = _verdict(spec, got, reference(spec, inputs, dims))
                verification.append(
                    {
                        "dims": dims,
                        "heldout": heldout,
                        "passed": ok,
                        "rel_err": rel,
                        "max_abs_err": mx,
                        "reason": why,
                    }
                )
                if not ok:
                    problems.append(f"wrong at {dims}: {why}")
        if not problems:
            for k, dims in enumerate(batch["shapes"]):
                inputs = random_inputs(spec, dims, seed=7 + k)
                samples = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    _run_on_cpu(spec, em, dims, inputs)
                    samples.append(round((time.perf_counter() - t0) * 1e6, 1))
                timing.append(
                    {
                        "dims": dims,
                        "median_us": statistics.median(samples),
                        "p20_us": min(samples),
                        "p80_us": max(samples),
                        "samples_us": samples,
                    }
                )
        entries.append(
            {
                "id": c["id"],
                "ptx_sha256": hashlib.sha256(c["ptx"].encode()).hexdigest(),
                "status": "failed" if problems else "passed",
                "reason": "; ".join(problems)[:500],
                "verification": verification,
                "timing": timing,
                "flags": [],
            }
        )
    baselines = [
        {
            "name": name,
            "version": "",
            "config": {},
            "status": "unavailable",
            "reason": NO_GPU_REASON,
            "verification": [],
            "timing": [],
        }
        for name in batch.get("baselines", [])
    ]
    return {
        "format": 1,
        "batch_id": batch["batch_id"],
        "env": {
            "gpu": CPU_ENV_GPU,
            "sm": "sm_90 emulated",
            "driver": "none",
            "hostname": platform.node(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            # No started_at/finished_at: the job page would count the span as GPU-seconds.
            "interpreter_started_at": started,
        },
        "timing_protocol": {
            "clock": "the CPU interpreter's wall-clock time per launch; not a GPU time",
            "repeats": repeats,
        },
        "candidates": entries,
        "baselines": baselines,
    }


# --- screenshots ----------------------------------------------------------------------------------


def shoot(page, name: str) -> None:
    """The page as it is, at its width and at a phone's, after checking it fits the phone."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.wait_for_load_state("networkidle")
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
    size = page.viewport_size
    page.set_viewport_size({"width": PHONE, "height": 900})
    try:
        # The charts re-lay themselves out at the new width: wait for each one's resize.
        page.evaluate(
            "() => Promise.all([...document.querySelectorAll('.js-plotly-plot')]"
            ".map((div) => window.Plotly ? Plotly.Plots.resize(div) : null))"
        )
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 1, f"{name} is {overflow} px wider than a {PHONE} px screen"
        page.screenshot(path=str(SHOTS / f"{name}-{PHONE}.png"), full_page=True)
    finally:
        page.set_viewport_size(size)


# --- the walk -----------------------------------------------------------------------------------


@pytest.fixture
def eager_pipeline(settings, tmp_path):
    """The Celery tasks run inside the request that queues them (no workers in a test), and the
    batch waits to be carried to a GPU host instead of going to a GPU queue."""
    from portal.celery import app

    settings.MEDIA_ROOT = tmp_path / "media"
    settings.GPU_DISPATCH = False
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    before = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = before


def _import_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_a_new_customer_walks_from_pytorch_code_to_a_checked_artifact(
    live_server,
    new_page,  # noqa: F811 - the fixture imported above
    orgs,
    customer,
    engineer,
    eager_pipeline,
    tmp_path,  # noqa: F811
):
    torch = pytest.importorskip("torch")
    from portal.models import Candidate, GpuBatch, Job

    base = live_server.url

    # 1. On the customer's machine: their PyTorch file becomes a manifest.
    model = tmp_path / "model.py"
    model.write_text(CUSTOMER_MODEL)
    manifest_path = tmp_path / "softmax.toml"
    imported = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from portal.cli import main; sys.exit(main())",
            "import",
            f"{model}:softmax",
            "--example-shapes",
            "x=8x256:bf16:-8..8",
            "--shape",
            "M=16,N=256",
            "--name",
            "attention_softmax",
            "-o",
            str(manifest_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert imported.returncode == 0, imported.stdout + imported.stderr
    manifest_text = manifest_path.read_text()
    assert 'name = "attention_softmax"' in manifest_text and "source:pytorch" in manifest_text

    # 2. The customer's first visit: log in, an empty home, the upload page with the file.
    page = new_page()
    page.goto(f"{base}/accounts/login/")
    shoot(page, "01-login")
    log_in(page, base, "alice", "alice-pass")
    shoot(page, "02-home-empty")
    page.click("text=New workload")
    page.wait_for_url(f"{base}/workloads/new/")
    page.set_input_files("#id_manifest_file", str(manifest_path))
    page.fill("#id_generations", "1")
    # One row length (256): the page's default of a job per row length makes one job.
    assert page.is_checked("#id_per_row_length")
    shoot(page, "03-upload")
    page.click("text=Validate and start", timeout=120_000)
    page.wait_for_url(f"{base}/jobs/**", timeout=120_000)
    job = Job.objects.get()
    assert job.workload.name == "attention_softmax"
    assert job.status == Job.WAITING_GPU, (job.status, job.stop_reason)
    shoot(page, "04-job-waiting-for-gpu")

    # 3. An engineer carries the batch to the "GPU host" (here: the CPU interpreter) and back.
    reviewer = new_page()
    log_in(reviewer, base, "erin", "erin-pass")
    shoot(reviewer, "05-engineer-home")
    reviewer.goto(f"{base}/jobs/{job.code}/")
    shoot(reviewer, "06-engineer-job-with-batch")
    with reviewer.expect_download() as batch_download:
        reviewer.click("text=Download batch")
    batch = json.loads(Path(batch_download.value.path()).read_text())
    assert batch["batch_id"] == str(GpuBatch.objects.get(job=job).code)
    assert batch["manifest"] == manifest_text
    results = cpu_stage(batch)
    # The results answer exactly this batch's kernels, matched by the hash of their PTX.
    sent = {
        str(k): v for k, v in Candidate.objects.filter(job=job).values_list("code", "ptx_sha256")
    }
    assert [e["id"] for e in results["candidates"]] == [c["id"] for c in batch["candidates"]]
    assert all(e["ptx_sha256"] == sent[e["id"]] for e in results["candidates"])
    verdicts = [e["status"] for e in results["candidates"]]
    assert verdicts.count("passed") >= 1, [e["reason"] for e in results["candidates"]]
    results_path = tmp_path / "results.json"
    results_path.write_text(json.dumps(results))
    reviewer.set_input_files("#id_results", str(results_path))
    reviewer.click("#import")
    reviewer.wait_for_selector("text=recorded")

    # The customer's page, still polling, reloads itself when the job waits for review.
    page.wait_for_selector("#progress[data-status=review]", timeout=30_000)
    shoot(page, "07-job-in-review")
    job.refresh_from_db()
    best = job.best_candidate
    assert best is not None and best.status == Candidate.PASSED
    page.goto(f"{base}/candidates/{best.code}/")
    assert CPU_ENV_GPU in page.inner_text("body")  # where it ran, said plainly
    shoot(page, "08-candidate")

    # 4. The engineer reviews: no baseline ran, so the comparison check fails; an override
    # with its reason is recorded.
    reviewer.click("text=Review queue")
    shoot(reviewer, "09-review-queue")
    reviewer.click(f"a[href='/review/{job.code}/']")
    reviewer.wait_for_selector("#checklist")
    shoot(reviewer, "10-review")
    failing = reviewer.locator("#checklist li.fail").all_inner_texts()
    assert failing, "with every baseline unavailable a check must fail"
    reviewer.fill(
        "#id_comment",
        "Verified by the CPU PTX interpreter at every shape; no GPU timing or baseline: "
        "approved for the walk-through only.",
    )
    reviewer.check("#id_override")
    reviewer.click("#approve")
    reviewer.wait_for_url(f"{base}/review/")
    job.refresh_from_db()
    assert job.status == Job.APPROVED
    assert job.reviews.get().checklist["override"] is True

    # 5. The customer is told, downloads the artifact, and finds the job on the home list.
    page.goto(f"{base}/jobs/{job.code}/")
    assert "Approved" in page.locator("#decision").inner_text()
    shoot(page, "11-job-approved")
    with page.expect_download() as download_info:
        page.click("#download")
    data = Path(download_info.value.path()).read_bytes()
    page.goto(f"{base}/")
    row = page.locator("#jobs tr", has=page.locator("text=attention_softmax"))
    assert "Approved" in row.inner_text()
    shoot(page, "12-home-with-the-job")
    page.goto(f"{base}/workloads/{job.workload.code}/")
    shoot(page, "13-workload")

    # 6. On the CPU: the artifact's checksums, loader checks, reference, and kernel.
    folder = tmp_path / "artifact"
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for line in z.read("SHA256SUMS").decode().splitlines():
            digest, name = line.split("  ", 1)
            assert hashlib.sha256(z.read(name)).hexdigest() == digest, name
        z.extractall(folder)
    shipped = json.loads((folder / "manifest.json").read_text())
    assert shipped["entry"] == best.entry
    assert (folder / "kernel.ptx").read_text() == best.ptx
    assert "pip install" in (folder / "README.md").read_text()

    sys.path.insert(0, str(folder / "examples"))
    try:
        loader = _import_module(folder / "examples" / "load_torch.py", "walk_load_torch")
        ref = _import_module(folder / "examples" / "reference.py", "reference")
    finally:
        sys.path.remove(str(folder / "examples"))
    customer_fn = _import_module(model, "walk_customer_model").softmax
    dims = {"M": 8, "N": 256}
    gen = torch.Generator().manual_seed(52)
    x = (torch.rand(8, 256, generator=gen) * 16 - 8).to(torch.bfloat16)

    # The loader refuses, with the reason, what the kernel cannot take; a CPU tensor of the
    # right kind gets as far as the device check.
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        loader.check_inputs({"x": x}, dims)
    with pytest.raises(TypeError, match="must be torch.bfloat16"):
        loader.check_inputs({"x": x.float()}, dims)
    with pytest.raises(ValueError, match="must have shape"):
        loader.check_inputs({"x": x[:4]}, dims)
    wide = torch.zeros(256, 16, dtype=torch.bfloat16).t()[:8]
    with pytest.raises(ValueError, match="contiguous"):
        loader.check_inputs({"x": wide}, {"M": 8, "N": 256})
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        loader.run(x, dims)  # the checks run before anything is launched

    # The artifact's float64 reference is the customer's PyTorch function.
    want = customer_fn(x)
    ((out_name, out_dtype),) = ref.OUTPUTS.items()
    tol = ref.TOLERANCES[out_dtype]
    assert ref.compare(out_name, want, ref.reference({"x": x})[out_name], tol)
    # And the approved kernel, run by the CPU interpreter, agrees with the PyTorch function.
    from factory.spec import load_manifest

    spec = load_manifest((folder / "workload.toml").read_text())
    em = _emitted((folder / "kernel.ptx").read_text(), shipped["params"], shipped["launch"])
    bits = x.view(torch.int16).numpy().view(np.uint16).copy()
    got = _run_on_cpu(spec, em, dims, {"x": bits})[out_name]
    assert ref.compare(out_name, torch.from_numpy(got), want.to(torch.float64), tol)
    for name in ("walk_load_torch", "reference", "walk_customer_model"):
        sys.modules.pop(name, None)
