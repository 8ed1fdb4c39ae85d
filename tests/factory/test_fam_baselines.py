"""The issue-50 families' torch baselines as the GPU worker makes them
(gpuworker.baselines.make_torch_baseline with the family's baselines module), run on the CPU
at small shapes against the float64 reference: the idiomatic calls (torch.sum(dim=...),
torch.cumsum, torch.argmax, ...) compute what the manifest says."""

from __future__ import annotations

import glob
from pathlib import Path

import numpy as np
import pytest

from factory import families
from factory.spec import load_manifest, random_inputs, reference
from factory.spec.manifest import with_pooled_dims

torch = pytest.importorskip("torch")

ROOT = Path(__file__).parents[2]
FAMS = ("colreduce", "segreduce", "allreduce", "scan", "argreduce", "pool", "segnorm")
EXAMPLES = sorted(p for f in FAMS for p in glob.glob(str(ROOT / f"factory/examples/{f}_*.toml")))
SMALL = {"T": 37, "C": 19, "N": 3, "H": 5, "W": 7, "B": 4, "S": 9, "D": 13, "R": 11, "M": 3,
         "V": 101, "L": 23}  # fmt: skip


def to_torch(arr: np.ndarray, dtype: str):
    if dtype == "bf16":
        return torch.from_numpy(arr.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(arr.copy())


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: Path(p).stem)
def test_the_workers_torch_eager_baseline_computes_the_reference(path):
    from gpuworker.baselines import make_torch_baseline

    w = load_manifest(Path(path).read_text())
    fam = families.name_for(w)
    assert fam in FAMS
    dims = with_pooled_dims(w.outputs, {d: SMALL[d] for d in w.dim_names})
    fn, _version, config = make_torch_baseline("torch_eager", w, fam)
    assert config["function"].startswith("idiomatic torch")
    ins = random_inputs(w, dims, 0)
    got = fn({t.name: to_torch(ins[t.name], t.dtype) for t in w.inputs})
    ref = reference(w, ins, dims)
    for o in w.outputs:
        g = got[o.name].float().double().numpy() if o.dtype != "int64" else got[o.name].numpy()
        want = ref[o.name]
        if o.dtype in ("int32", "int64"):
            assert (g == want).all()
        else:
            tol = w.tolerance[o.dtype]
            bad = ~(np.abs(g - want) <= tol.atol + tol.rtol * np.abs(want))
            assert not bad.any(), (o.name, np.abs(g - want).max())


SPLIT = sorted(
    p for f in ("rowsplit", "flat") for p in glob.glob(str(ROOT / f"factory/examples/{f}_*.toml"))
)


@pytest.mark.parametrize("path", SPLIT, ids=lambda p: Path(p).stem)
def test_the_split_and_flat_families_torch_baselines_compute_the_reference(path):
    """Few long rows and flat elementwise work: the row family's torch baselines (the
    idiomatic call where the operator is a catalogue one, else the expression in torch)."""
    from gpuworker.baselines import make_torch_baseline

    w = load_manifest(Path(path).read_text())
    fam = families.name_for(w)
    assert fam in ("rowsplit", "flat")
    dims = {d: SMALL[d] for d in w.dim_names}
    fn, _version, _config = make_torch_baseline("torch_eager", w, fam)
    ins = random_inputs(w, dims, 0)
    got = fn({t.name: to_torch(ins[t.name], t.dtype) for t in w.inputs})
    ref = reference(w, ins, dims)
    for o in w.outputs:
        g = got[o.name].float().double().numpy()
        tol = w.tolerance[o.dtype]
        assert (np.abs(g - ref[o.name]) <= tol.atol + tol.rtol * np.abs(ref[o.name])).all()
