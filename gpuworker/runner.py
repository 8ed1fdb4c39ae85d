"""`run_batch`: a format-1 batch in, a format-1 results dict out (docs/CONTRACTS.md).

The judging process (this one) never initialises CUDA. It parses the batch, draws the inputs from
a seed nobody else knows (os.urandom), computes the float64 reference once per shape and input
set, compiles every candidate for the exact device with nvJitLink (PTX that uses setmaxnreg
with ptxas as a whole program where PTXF_WHOLE_PROGRAM=1, see `_compile`), and hands the GPU
work to a child process (worker.py / child.py) one request at a time. A candidate that crashes
or hangs the child is recorded with the reason, the child is replaced (by a standby child
prepared in the background unless `options.warm_spare` is off), and the batch goes on.

Phases: verify every entrant (candidates, then baselines) at every shape and held-out shape, run
twice; then, per benchmarked shape, time every entrant that passed, interleaved on the same
inputs, with every timed run's output checked; then plausibility flags.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import time
from datetime import UTC, datetime

import numpy as np

from gpuworker import plausibility
from gpuworker.baselines import TORCH_BASELINES
from gpuworker.batch import (
    RESULTS_FORMAT,
    Batch,
    baseline_record,
    candidate_record,
    launch_to_json,
    params_to_json,
    parse_batch,
)
from gpuworker.judge import shape_verdict, timed_checks_reason, timing_record
from gpuworker.worker import ChildFailed, ChildWorker, allow_children

DEFAULT_L2_BYTES = 60 << 20
INPUT_SETS_L2_MULTIPLE = 3  # rotated input sets total at least 3x the L2
MAX_SETS = 8
_TARGET = re.compile(r"^\s*\.target\s+(sm_\d+a?)", re.M)


class NoGpu(RuntimeError):
    """There is no usable GPU on this host (the message says why)."""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _log(log, msg: str):
    if log:
        log(msg)


def _spec():
    import factory.spec as spec

    return spec


def _numel(shape) -> int:
    return int(np.prod(shape, dtype=np.int64)) if len(shape) else 1


class _SharedArrays:
    """Inputs and references handed to the child: shared-memory blocks when /dev/shm has room,
    else files in a temporary folder (a full /dev/shm kills a writer with SIGBUS, so we check
    first). Each `put` returns a locator the child opens with `_upload_shared`. Helper processes
    make blocks and `release` them; the judging process `adopt`s them and unlinks at `close`."""

    def __init__(self, tmpdir: str | None = None):
        self.blocks = []
        self.tmpdir = tmpdir
        self.owns_tmpdir = False

    def tmpdir_for_helpers(self) -> str:
        import tempfile

        if self.tmpdir is None:
            self.tmpdir = tempfile.mkdtemp(prefix="gpuworker-")
            self.owns_tmpdir = True
        return self.tmpdir

    @staticmethod
    def _shm_room(nbytes: int) -> bool:
        try:
            st = os.statvfs("/dev/shm")  # noqa: S108 - only its free space is read
        except OSError:
            return False
        return st.f_bavail * st.f_frsize > nbytes * 1.2 + (256 << 20)

    def put(self, arr: np.ndarray) -> dict:
        from multiprocessing import shared_memory

        arr = np.ascontiguousarray(arr)
        flat = arr.view(np.uint8).reshape(-1)
        if self._shm_room(arr.nbytes):
            shm = shared_memory.SharedMemory(create=True, size=max(arr.nbytes, 1))
            np.ndarray((arr.nbytes,), dtype=np.uint8, buffer=shm.buf)[:] = flat
            self.blocks.append(shm)
            return {"shm": shm.name, "nbytes": int(arr.nbytes)}
        import uuid

        path = os.path.join(self.tmpdir_for_helpers(), f"{uuid.uuid4().hex}.bin")
        flat.tofile(path)
        return {"file": path, "nbytes": int(arr.nbytes)}

    def release(self):
        """Unmap our blocks but leave them in place for whoever adopts them."""
        for shm in self.blocks:
            shm.close()
        self.blocks = []

    def adopt(self, loc: dict):
        from multiprocessing import shared_memory

        if "shm" in loc:
            self.blocks.append(shared_memory.SharedMemory(name=loc["shm"]))

    def close(self):
        import shutil

        for shm in self.blocks:
            shm.close()
            try:
                shm.unlink()
            except FileNotFoundError:
                pass
        self.blocks = []
        if self.tmpdir and self.owns_tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None


def _compile_arch(ptx: str, device_arch: str) -> str:
    """Compile for the device's exact architecture; keep the 'a' (arch-specific) variant when the
    PTX asks for it on the same chip (wgmma needs sm_90a)."""
    m = _TARGET.search(ptx)
    if m and m.group(1).endswith("a") and m.group(1)[:-1] == device_arch:
        return m.group(1)
    return device_arch


def _compile(ptx: str, arch: str) -> tuple[dict | None, bytes | None, str]:
    """(report dict, cubin, error) through factory.compile; (None, None, "") when nvJitLink is
    not importable here (the child then links the PTX itself).

    With PTXF_WHOLE_PROGRAM=1, PTX that uses setmaxnreg is compiled by the toolkit's ptxas as a
    whole program (factory.families.attention.wholeprog: nvJitLink's relocatable compile ignores
    setmaxnreg), for the same arch. The report's "compiler" says which one compiled it
    ("ptxas-whole" or "nvjitlink"); "compiler_note" says why nvJitLink did where the setting
    asked for ptxas and none was found. Either cubin is a linked, non-relocatable image: the child
    loads both the same way (ObjectCode.from_cubin)."""
    try:
        from factory.compile import compile_ptx, target_arch
        from factory.families.attention import wholeprog
    except ImportError:
        return None, None, ""
    compiler, ptxas, note = wholeprog.choose_compiler(ptx)
    if compiler == wholeprog.COMPILER_WHOLE:
        rep = wholeprog.compile_whole(ptx, target_arch(ptx, arch), ptxas)
        refused = "ptxas refused the PTX"
    else:
        rep = compile_ptx(ptx, arch, cache=False)  # the cubin timed here comes from this PTX
        refused = "nvJitLink refused the PTX"
    report = {**rep.to_dict(), "compiler": compiler}
    if note:
        report["compiler_note"] = note
    if not rep.ok:
        return report, None, rep.log.strip()[-2000:] or refused
    return report, rep.cubin, ""


# Every helper process loads its own BLAS, whose thread pool is sized to the whole machine: 6
# attention helpers with a 16-thread OpenBLAS pool each spent 97 s on 4 input sets on a 16-core
# host (~12 s of work a set on one core). Helpers therefore start with BLAS at one thread (these
# variables are read when numpy loads) and take their share of the cores as the reference's own
# threads (PTXF_REFERENCE_THREADS, read by factory.spec.attention).
BLAS_THREAD_VARS = (
    "OPENBLAS_NUM_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
REFERENCE_THREADS_VAR = "PTXF_REFERENCE_THREADS"


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def helper_threads(workers: int, heavy: int) -> int:
    """Threads each of `workers` helper processes may use: the cores shared by the helpers that
    draw the benchmarked shapes' sets (`heavy` of them; the held-out sets are small), at
    least 1."""
    busy = max(1, min(workers, heavy))
    return max(1, _cores() // busy)


@contextlib.contextmanager
def helper_environment(threads: int):
    """Within: processes started from here get BLAS at one thread and `threads` reference
    threads. This process's own environment is put back on exit (its numpy is loaded already,
    so its BLAS is unchanged either way)."""
    names = (*BLAS_THREAD_VARS, REFERENCE_THREADS_VAR)
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update({name: "1" for name in BLAS_THREAD_VARS})
    os.environ[REFERENCE_THREADS_VAR] = str(int(threads))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _make_set(task: tuple) -> tuple[dict, dict]:
    """One input set and its float64 reference, placed where the child can read them. Runs in
    a helper process (or inline); returns (inputs, outputs) as name -> (locator, shape)."""
    manifest, baseline_source, dims, seed, tmpdir = task
    spec = _spec()
    w = spec.load_manifest(manifest, baseline_source=baseline_source)
    arrs = spec.random_inputs(w, dims, seed)
    ref = spec.reference(w, arrs, dims)
    store = _SharedArrays(tmpdir=tmpdir)
    ins = {name: (store.put(a), list(np.shape(a))) for name, a in arrs.items()}
    outs = {
        o.name: (store.put(np.asarray(ref[o.name], dtype=np.float64)), list(np.shape(ref[o.name])))
        for o in w.outputs
    }
    store.release()
    return ins, outs


def _declared_bytes(decl_shape, dtype: str, dims: dict) -> int:
    from factory.spec.expr import DTYPE_BYTES

    n = 1
    for d in decl_shape:
        n *= dims[d] if isinstance(d, str) else int(d)
    return n * DTYPE_BYTES[dtype]


def _prepare_data(w, batch: Batch, seed: int, l2_bytes: int, shared: _SharedArrays, log):
    """Draw inputs and compute references (in parallel helper processes where the host has the
    cores), placed where the child can read them. Returns the child's shape specs, per shape
    index (dims, heldout, bytes moved), and the tolerances by output."""
    from concurrent.futures import ProcessPoolExecutor

    from factory.spec.expr import DTYPE_BYTES

    t0 = time.monotonic()
    tol_json = {
        o.name: {
            "rel_norm": w.tolerance[o.dtype].rel_norm,
            "atol": w.tolerance[o.dtype].atol,
            "rtol": w.tolerance[o.dtype].rtol,
        }
        for o in w.outputs
    }
    all_shapes = [(d, False) for d in batch.shapes] + [(d, True) for d in batch.heldout_shapes]
    plan, tasks = [], []
    for index, (dims, heldout) in enumerate(all_shapes):
        set_bytes = sum(_declared_bytes(t.shape, t.dtype, dims) for t in w.inputs)
        want = math.ceil(INPUT_SETS_L2_MULTIPLE * l2_bytes / max(set_bytes, 1))
        sets = 1 if heldout else int(min(MAX_SETS, max(2, want)))
        plan.append((index, dims, heldout, sets))
        for k in range(sets):
            task_seed = (seed + 7919 * index + 104729 * k) % (2**63)
            tasks.append(
                (
                    batch.manifest,
                    batch.baseline_source,
                    dict(dims),
                    task_seed,
                    shared.tmpdir_for_helpers(),
                )
            )
    workers = min(len(tasks), max(1, (os.cpu_count() or 2) - 2), 8)
    threads = 1
    if workers > 1:
        heavy = sum(sets for _, _, heldout, sets in plan if not heldout)
        threads = helper_threads(workers, heavy)
        allow_children()
        ctx = __import__("multiprocessing").get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            with helper_environment(threads):  # read by the helpers as they start
                futures = [pool.submit(_make_set, t) for t in tasks]
            made = [f.result() for f in futures]
    else:
        made = [_make_set(t) for t in tasks]
    for ins, outs in made:
        for loc, _ in list(ins.values()) + list(outs.values()):
            shared.adopt(loc)
    shapes, meta, cursor = [], {}, 0
    for index, dims, heldout, sets in plan:
        inputs = {t.name: {"shm": [], "dtype": t.dtype} for t in w.inputs}
        outputs = {
            o.name: {"ref_shm": [], "dtype": o.dtype, "tol": tol_json[o.name]} for o in w.outputs
        }
        for _ in range(sets):
            ins, outs = made[cursor]
            cursor += 1
            for name, (loc, shape) in ins.items():
                inputs[name]["shm"].append(loc)
                inputs[name].update(shape=shape, nbytes=loc["nbytes"])
            for o in w.outputs:
                loc, shape = outs[o.name]
                numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
                outputs[o.name]["ref_shm"].append(loc)
                outputs[o.name].update(
                    shape=shape, numel=numel, nbytes=numel * DTYPE_BYTES[o.dtype]
                )
        bytes_moved = sum(t["nbytes"] for t in inputs.values()) + sum(
            o["nbytes"] for o in outputs.values()
        )
        shapes.append(
            {
                "index": index,
                "dims": dict(dims),
                "heldout": heldout,
                "sets": sets,
                "inputs": inputs,
                "outputs": outputs,
            }
        )
        meta[index] = (dict(dims), heldout, bytes_moved)
    _log(
        log,
        f"{len(tasks)} input sets and references for {len(plan)} shapes in "
        f"{time.monotonic() - t0:.1f} s ({workers} helper process(es), "
        f"{threads} thread(s) each, BLAS {'1 thread' if workers > 1 else 'as set'})",
    )
    return shapes, meta, tol_json


def run_batch(batch: dict, *, log=None) -> dict:
    """Verify and time every candidate of a format-1 batch; return the format-1 results dict.

    Raises BatchError (batch), SpecError (manifest) or NoGpu (no usable GPU here): those are the
    caller's or the host's problems. Everything a candidate or baseline does, including faults
    and hangs, ends up in its record instead.
    """
    started = _now()
    b = parse_batch(batch)
    spec = _spec()
    w = spec.load_manifest(b.manifest, baseline_source=b.baseline_source)
    # The workload's own held-out shapes are always checked too: a batch cannot opt out of them.
    heldout = [dict(d) for d in b.heldout_shapes]
    for d in w.heldout_shapes:
        if dict(d) not in heldout and dict(d) not in [dict(s) for s in b.shapes]:
            heldout.append(dict(d))
    b = dataclasses.replace(b, heldout_shapes=tuple(heldout))
    opts = b.options
    seed = opts.seed if opts.seed is not None else int.from_bytes(os.urandom(6), "little")

    child = ChildWorker(warm_spare=opts.warm_spare)
    try:
        hello = child.start()
    except ChildFailed as e:
        raise NoGpu(e.reason) from e
    shared = _SharedArrays()
    try:
        return _run(b, w, seed, child, hello, shared, started, log)
    finally:
        child.stop()
        shared.close()


def _run(b: Batch, w, seed: int, child: ChildWorker, hello: dict, shared, started: str, log):
    opts = b.options
    arch = hello["arch"]
    shapes, meta, tol = _prepare_data(
        w, b, seed, hello.get("l2_bytes") or DEFAULT_L2_BYTES, shared, log
    )
    reply = child.setup(
        {
            "op": "setup",
            "manifest": b.manifest,
            "baseline_source": b.baseline_source,
            "shapes": shapes,
        }
    )
    if not reply.get("ok"):
        raise RuntimeError(f"the worker could not take the batch's data: {reply.get('error')}")
    bench_idx = [i for i, (_, heldout, _) in meta.items() if not heldout]
    all_idx = sorted(meta)

    # Measured under the same L2 flush as the entrants, so the two compare like with like; and
    # alone on the GPU (the standby child, when on, prepares its copy of the data meanwhile).
    child.settle()
    ceiling = _request(child, {"op": "copy_ceiling", "l2_flush": opts.l2_flush})
    copy_ceiling_tbps = ceiling.get("tbps") if ceiling.get("ok") else None
    _log(log, f"copy ceiling {copy_ceiling_tbps} TB/s")
    # The same protocol with each benchmarked shape's own bytes (judge_mix): what its mix of
    # reads and writes reaches with nothing computed. A child that cannot answer costs the
    # batch nothing but this comparison.
    mover = _request(child, {"op": "byte_mover", "shapes": bench_idx, "l2_flush": opts.l2_flush})
    mover_by_shape = plausibility.movers_by_shape(
        mover.get("shapes", []) if mover.get("ok") else []
    )
    _log(log, "byte mover " + ", ".join(f"{v:.2f}" for v in mover_by_shape.values()) + " TB/s")

    # -- entrants ---------------------------------------------------------------------------
    entrants = []  # (record, desc or None)
    for c in b.candidates:
        rec = candidate_record(c.id, c.ptx)
        params, launch = c.params, c.launch
        if params is None:
            if w.baseline is None:
                rec.update(
                    status="failed",
                    reason="no params/launch given and the workload has "
                    "no baseline binding to borrow",
                )
                entrants.append((rec, None))
                continue
            params, launch = w.baseline.params, w.baseline.launch
        report, cubin, err = _compile(c.ptx, _compile_arch(c.ptx, arch))
        rec["compile"] = report
        if err:
            rec.update(status="compile_error", reason=err)
            entrants.append((rec, None))
            continue
        desc = {
            "key": f"candidate:{c.id}",
            "kind": "ptx",
            "cubin": cubin,
            "ptx": c.ptx,
            "entry": c.entry,
            "params": params_to_json(params),
            "launch": launch_to_json(launch),
        }
        entrants.append((rec, desc))
    baselines = []
    for name in b.baselines:
        rec = baseline_record(name)
        if name == "customer":
            if w.baseline is None:
                rec.update(status="unavailable", reason="the workload has no customer kernel")
                baselines.append((rec, None))
                continue
            bk = w.baseline
            report, cubin, err = _compile(bk.ptx, _compile_arch(bk.ptx, arch))
            rec.update(
                version=f"sha256:{w.sha256[:16]}",
                config={
                    "entry": bk.entry,
                    "language": bk.language,
                    "launch": launch_to_json(bk.launch),
                },
            )
            if err:
                rec.update(status="compile_error", reason=err)
                baselines.append((rec, None))
                continue
            desc = {
                "key": "baseline:customer",
                "kind": "ptx",
                "cubin": cubin,
                "ptx": bk.ptx,
                "entry": bk.entry,
                "params": params_to_json(bk.params),
                "launch": launch_to_json(bk.launch),
            }
        elif name in TORCH_BASELINES:
            desc = {
                "key": f"baseline:{name}",
                "kind": "torch",
                "name": name,
                "family": b.family,
            }
        else:  # parse_batch refuses unknown names; kept for safety
            rec.update(status="unavailable", reason="unknown baseline")
            baselines.append((rec, None))
            continue
        baselines.append((rec, desc))

    # -- verification -------------------------------------------------------------------------
    t_verify = time.monotonic()
    # ours must give the same bits twice; a baseline is judged by each run's tolerance alone
    judged = [(r, d, True) for r, d in entrants] + [(r, d, False) for r, d in baselines]
    for rec, desc, require_repeatable in judged:
        if desc is None:
            continue
        t_entrant = time.monotonic()
        reply = _guarded(
            child,
            {
                "op": "verify",
                "entrant": desc,
                "shapes": all_idx,
                "timeout_s": opts.timeout_s_per_candidate,
            },
            rec,
        )
        rec["verify_wall_s"] = round(time.monotonic() - t_entrant, 3)
        if reply is None:
            _log(
                log,
                f"{desc['key']}: {rec['status']} after {rec['verify_wall_s']:.1f} s "
                f"({rec['reason'][:100]})",
            )
            continue
        if desc["kind"] == "torch":
            info = _request(child, {"op": "entrant_info", "entrant": desc})
            if info.get("ok"):
                rec.update(version=info["version"], config=info["config"])
        records = [
            shape_verdict(r, *meta[r["shape"]][:2], tol, require_repeatable)
            for r in reply["shapes"]
        ]
        rec["verification"] = records
        bad = [r for r in records if not r["passed"]]
        if bad:
            rec.update(
                status="failed",
                reason="; ".join(
                    f"{'held-out ' if r['heldout'] else ''}{_dims_str(r['dims'])}: {r['reason']}"
                    for r in bad[:3]
                ),
            )
        else:
            rec["status"] = "verified"
    _log(log, f"verification done in {time.monotonic() - t_verify:.1f} s")

    # -- timing -------------------------------------------------------------------------------
    t_time = time.monotonic()
    n_timed = sum(1 for rec, _ in entrants + baselines if rec["status"] == "verified")
    budget = opts.time_budget_s_per_candidate * max(n_timed, 1) / max(len(bench_idx), 1)
    for idx in bench_idx:
        dims, _, bytes_moved = meta[idx]
        while True:
            live = [
                (rec, desc) for rec, desc in entrants + baselines if rec["status"] == "verified"
            ]
            if not live:
                break
            # No standby child preparing, and no killed one tearing down, during a measurement.
            child.settle()
            msg = {
                "op": "time",
                "shape": idx,
                "entrants": [d for _, d in live],
                "budget_s": budget,
                "timeout_s": opts.timeout_s_per_candidate,
                "check_outputs": opts.check_timed_outputs,
                "l2_flush": opts.l2_flush,
                "timed_outputs": opts.timed_outputs,
            }
            try:
                reply = child.request(msg)
            except ChildFailed as e:
                culprit = live[e.entrant_index][0] if 0 <= e.entrant_index < len(live) else None
                _blame(culprit, e.kind, f"during timing at {_dims_str(dims)}: {e.reason}")
                _restart(child)
                if culprit is None:
                    break
                continue
            if not reply.get("ok"):
                i = reply.get("entrant_index", -1)
                culprit = live[i][0] if 0 <= i < len(live) else None
                _blame(culprit, "crashed", f"during timing at {_dims_str(dims)}: {reply['error']}")
                if reply.get("fatal"):
                    _restart(child)
                if culprit is None:
                    break
                continue
            for rec, desc in live:
                r = reply["entrants"][desc["key"]]
                reason = timed_checks_reason(r["timed_checks"], r["input_bytes_changed"])
                if reason:
                    rec.update(status="failed", reason=f"at {_dims_str(dims)}: {reason}")
                rec["timing"].append(
                    timing_record(
                        dims,
                        r["samples_us"],
                        bytes_moved,
                        reply["sm_clocks_mhz"],
                        reply["sets"],
                        r["timed_checks"],
                        r.get("hold_us"),
                        r.get("host_gap_runs", 0),
                        r.get("timed_outputs"),
                        r.get("same_outputs_as_baselines"),
                    )
                )
            break
    _log(log, f"timing done in {time.monotonic() - t_time:.1f} s")

    for rec, _ in entrants + baselines:
        if rec["status"] == "verified":
            if len(rec["timing"]) == len(bench_idx):
                rec["status"] = "passed"
            else:
                rec.update(status="failed", reason="not timed at every benchmarked shape")
    best = plausibility.best_baseline_by_shape([r for r, _ in baselines])
    for rec, _ in entrants:
        rec["flags"] = plausibility.flags_for(
            rec["timing"], copy_ceiling_tbps, best, mover_by_shape
        )
    for rec, _ in baselines:
        rec["flags"] = plausibility.flags_for(
            rec["timing"], copy_ceiling_tbps, {}, mover_by_shape
        ) + plausibility.repeatability_flags(rec.get("verification", []))

    env = {
        k: hello.get(k)
        for k in (
            "gpu",
            "sm",
            "driver",
            "cuda_core",
            "cuda_bindings",
            "nvjitlink",
            "torch",
            "triton",
            "liger_kernel",
            "hostname",
            "sm_count",
            "l2_bytes",
            "python",
            "numpy",
        )
    }
    clocks = [
        t["sm_clock_mhz"]
        for rec, _ in entrants + baselines
        for t in rec["timing"]
        if t.get("sm_clock_mhz")
    ]
    env.update(
        sm_clock_mhz=max(clocks) if clocks else None,
        started_at=started,
        finished_at=_now(),
        worker_restarts=child.restarts,
        restart_s=child.restart_s,
        # Per restart: "source" (warm_spare or cold), "switch_s" (what it cost the batch),
        # "spare_wait_s" (waiting for a spare still preparing), "spare_age_s", "spare_error".
        restart_log=child.restart_log,
        warm_spare=opts.warm_spare,
        spares_started=child.spares_started,
        spare_disabled=child.spare_disabled_reason or None,
    )
    return {
        "format": RESULTS_FORMAT,
        "batch_id": b.batch_id,
        "family": b.family,
        "env": env,
        "seed": seed,
        "copy_ceiling_tbps": copy_ceiling_tbps,
        "copy_ceiling": ceiling if ceiling.get("ok") else {"error": ceiling.get("error")},
        "byte_mover": mover["shapes"] if mover.get("ok") else {"error": mover.get("error")},
        "timing_protocol": {"l2_flush": opts.l2_flush, "timed_outputs": opts.timed_outputs},
        "candidates": [rec for rec, _ in entrants],
        "baselines": [rec for rec, _ in baselines],
    }


def _dims_str(dims: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in dims.items())


def _blame(rec, kind: str, reason: str):
    if rec is not None:
        rec.update(status="timeout" if kind == "timeout" else "crashed", reason=reason)


def _restart(child: ChildWorker):
    t0 = time.monotonic()
    child.restart()
    child.restart_s.append(round(time.monotonic() - t0, 3))


def _request(child: ChildWorker, msg: dict) -> dict:
    """A request whose failure is nobody's fault but ours: restart and report."""
    try:
        reply = child.request(msg)
    except ChildFailed as e:
        _restart(child)
        return {"ok": False, "error": str(e)}
    if not reply.get("ok") and reply.get("fatal"):
        _restart(child)
    return reply


def _guarded(child: ChildWorker, msg: dict, rec: dict) -> dict | None:
    """Run one entrant's request; on failure fill its record and return None."""
    try:
        reply = child.request(msg)
    except ChildFailed as e:
        _blame(rec, e.kind, e.reason)
        _restart(child)
        return None
    if reply.get("ok"):
        return reply
    if reply.get("unavailable"):
        rec.update(status="unavailable", reason=reply["error"])
    elif reply.get("entrant_error"):
        rec.update(status="failed", reason=reply["error"])
    else:
        rec.update(status="crashed", reason=reply["error"])
    if reply.get("fatal"):
        _restart(child)
    return None
