"""Issue 50's new kinds through the portal: a customer's job for the catalogue's
softmax_long_rows (few long rows: the split-row family) and for axpby (pure elementwise: the
flat family) is planned, written, compiled and reviewed by the real agents and reaches "waiting
for GPU results" with a batch naming its family; the queued candidates' PTX, exactly as stored,
then runs in factory.ptxsim at a small odd shape and matches the float64 reference."""

import numpy as np
import pytest

from factory import families, ptxsim
from factory.spec import load_manifest, random_inputs, reference, to_float64
from portal.models import Candidate, Job
from tests.factory.test_fam_workspace_paths import run_twice, workspace_ops  # noqa: F401


@pytest.fixture
def submit(submit_to_gpu_stage):
    from factory.spec import catalogue_manifest

    return lambda name: submit_to_gpu_stage(catalogue_manifest(name), seed=5)


def outputs_of(w, dims, arrays_in, run):
    arrays, shapes = dict(arrays_in), {}
    for o in w.outputs:
        shapes[o.name] = tuple(int(dims[d]) for d in o.shape)
        dt = np.float32 if o.dtype == "fp32" else np.uint16
        arrays[o.name] = np.full(shapes[o.name], np.nan if o.dtype == "fp32" else 0xFFFF, dt)
    got = run(arrays)
    out = {}
    for o in w.outputs:
        dt = np.float32 if o.dtype == "fp32" else np.uint16
        out[o.name] = to_float64(np.frombuffer(got[o.name], dt).reshape(shapes[o.name]), o.dtype)
    return out


def assert_matches(w, got, want):
    for o in w.outputs:
        tol = w.tolerance[o.dtype]
        g, r = got[o.name], want[o.name]
        assert np.isfinite(g).all()
        assert (np.abs(g - r) <= tol.atol + tol.rtol * np.abs(r)).all()
        assert np.linalg.norm(g - r) / np.linalg.norm(r) <= tol.rel_norm


def queued(job, family):
    assert job.status == Job.WAITING_GPU, job.stop_reason
    batch = job.batches.get().batch
    assert batch["family"] == family
    cands = list(job.candidates.filter(status=Candidate.QUEUED))
    assert cands, "no candidate survived the build"
    w = load_manifest(job.workload.manifest)
    fam, ir = families.family_for(w)
    assert fam.name == family
    for c in cands:
        assert c.schedule["family"] == family
        assert c.compile_report and c.compile_report["ok"]
        em = fam.emit(ir, c.schedule)
        assert em.ptx == c.ptx  # the stored kernel is the family's rendering of its schedule
    return w, fam, ir, cands


def test_a_few_long_rows_job_reaches_the_gpu_stage_with_kernels_verified_here(
    submit,
    workspace_ops,  # noqa: F811
):
    job = submit("softmax_long_rows")
    w, fam, ir, cands = queued(job, "rowsplit")
    dims = {"M": 3, "N": 2999}
    ins = random_inputs(w, dims, 17)
    want = reference(w, ins, dims)
    for c in cands:
        em = fam.emit(ir, c.schedule)
        first = outputs_of(w, dims, ins, lambda a, em=em: run_twice(em, dims, a, ("y",))[0])
        assert_matches(w, first, want)


def test_a_flat_elementwise_job_reaches_the_gpu_stage_with_kernels_verified_here(submit):
    job = submit("axpby")
    w, fam, ir, cands = queued(job, "flat")
    dims = {"M": 3, "N": 1001}
    ins = random_inputs(w, dims, 17)
    want = reference(w, ins, dims)
    for c in cands:
        em = fam.emit(ir, c.schedule)
        got = outputs_of(w, dims, ins, lambda a, em=em: ptxsim.run_kernel(em, dims, a, grid=2))
        assert_matches(w, got, want)
