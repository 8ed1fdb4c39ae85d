"""Record a batch's results on a GPU host and check the artifact's loader examples there.

Run on the GPU host from the repository root (no Django there):

    PYTHONPATH=. python3 tests/browser/h200_record.py BATCH.json OUTDIR

1. `python -m gpuworker run BATCH.json -o OUTDIR/results.json` (the real judge and timer);
2. the artifact of the fastest passing candidate is built from plain data with
   portal/artifacts.py (loaded by path: the portal package itself needs Django and Celery);
3. the artifact's two loader examples are run from the unpacked zip, and what they print is
   written to OUTDIR/loaders.log, so the examples a customer gets are known to work.
The recorded results keep each candidate's PTX hash (`ptx_sha256`), so a later import can match
the evidence to exactly the kernel it belongs to.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
import zipfile
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_artifacts_module():
    spec = importlib.util.spec_from_file_location(
        "ptxf_artifacts", ROOT / "portal" / "artifacts.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def main(batch_path: str, out_dir: str) -> int:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    run = subprocess.run(
        [sys.executable, "-m", "gpuworker", "run", batch_path, "-o", str(results_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    (out / "gpuworker.log").write_text(run.stdout + run.stderr)
    print(run.stdout[-3000:], run.stderr[-3000:], sep="\n")
    if run.returncode != 0:
        return run.returncode
    batch = json.loads(Path(batch_path).read_text())
    results = json.loads(results_path.read_text())
    ptx_by_id = {c["id"]: c for c in batch["candidates"]}
    for entry in results["candidates"]:
        entry["ptx_sha256"] = hashlib.sha256(ptx_by_id[entry["id"]]["ptx"].encode()).hexdigest()
    results_path.write_text(json.dumps(results, indent=1))

    passed = [e for e in results["candidates"] if e["status"] == "passed" and e["timing"]]
    if not passed:
        print("no candidate passed: no artifact to check")
        return 0

    def score(entry):
        medians = [t["median_us"] for t in entry["timing"]]
        product = 1.0
        for m in medians:
            product *= m
        return product ** (1 / len(medians))

    best = min(passed, key=score)
    cand = ptx_by_id[best["id"]]
    from factory.spec import load_manifest

    spec = load_manifest(
        batch["manifest"],
        baseline_source=batch.get("baseline_source"),
        baseline_filename=batch.get("baseline_filename"),
    )
    params = cand.get("params") or [asdict(p) for p in spec.baseline.params]
    launch = cand.get("launch") or {
        "grid": list(spec.baseline.launch.grid),
        "block": list(spec.baseline.launch.block),
        "smem_bytes": spec.baseline.launch.smem_bytes,
        "cluster": spec.baseline.launch.cluster,
    }
    artifacts = load_artifacts_module()
    inputs = artifacts.ArtifactInputs(
        workload_name=spec.name,
        workload_code="h200-record",
        job_code="h200-record",
        candidate_code=best["id"],
        entry=cand["entry"],
        ptx=cand["ptx"],
        params=params,
        launch=launch,
        shapes=[dict(s) for s in spec.shapes],
        heldout_shapes=[dict(s) for s in spec.heldout_shapes],
        inputs=[{"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in spec.inputs],
        outputs=[{"name": o.name, "shape": list(o.shape), "dtype": o.dtype} for o in spec.outputs],
        tolerances={k: asdict(v) for k, v in spec.tolerance.items()},
        manifest_toml=batch["manifest"],
        env=results.get("env", {}),
        verification=best["verification"],
        timing=best["timing"],
        baselines=results.get("baselines", []),
    )
    built = artifacts.build_artifact(inputs)
    zip_path = out / "artifact.zip"
    zip_path.write_bytes(built.data)
    unpacked = out / "unpacked"
    with zipfile.ZipFile(zip_path) as z:
        z.extractall(unpacked)
    log = []
    for example in ("examples/load_cuda_python.py", "examples/load_torch.py"):
        proc = subprocess.run(
            [sys.executable, example], cwd=unpacked, capture_output=True, text=True, timeout=300
        )
        log.append(f"$ python {example}  -> exit {proc.returncode}\n{proc.stdout}{proc.stderr}")
    (out / "loaders.log").write_text("\n".join(log))
    print("\n".join(log))
    # The unpacked tree would come back as too many files; the zip and the log are enough.
    subprocess.run(["rm", "-rf", str(unpacked)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
