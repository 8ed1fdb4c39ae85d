"""Direct timing in one process: our kernels, torch eager and the plain Triton baselines, and the
copy ceiling, side by side on the same device buffers, with CUDA events.

The suite's primary path is `gpuworker.run_batch` (separate verification process, fresh inputs,
guard regions, held-out shapes). This one trades those for speed on a short lease: one CUDA
context, one torch import, inputs drawn on the GPU, every timed entrant's output poisoned first
and checked again (every element finite; sampled rows against factory.spec's float64 reference
under the manifest's tolerance). Timing: rounds interleave the entrants; each run is preceded by
an L2 flush (a 256 MB read by default, or write), one event pair per run, a round queued as a
whole so that host launch costs stay off the timer, each round starting one entrant later than
the last (no entrant always in the same place), the median kept with p20/p80.
"""

from __future__ import annotations

import math
import time

import numpy as np

from factory.compile import rejection_reason
from factory.emit import emit
from factory.spec import eval_dim_expr

L2_FLUSH_BYTES = 256 << 20  # several times the H200's 60 MB L2
_EMITTED: dict = {}
SAMPLE_ROWS = (0, 1, 2, 4097, -2, -1)
# entrants that write into the case's own output tensors (verified there, before and after
# timing): our kernels, and foreign kernels launched as ours are (lab/probes/probe_foreign.py)
OWN_OUTPUTS = ("ours", "foreign")
# Baselines that experiments add by a name prefix ("mover:", "bulk:": lab/probes/mover.py and
# bulkrows.py register theirs on import): prefix -> f(bench, name, workload, inputs, outputs),
# which returns (run, config, its own outputs or None) or raises ValueError where the entrant
# cannot run this case.
EXTRA_ENTRANTS: dict = {}


class Bench:
    def __init__(self):
        import torch
        from cuda.core import Device

        self.torch = torch
        torch.cuda.init()
        self.dev = Device()
        self.dev.set_current()
        self.flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
        self.flush.fill_(1)
        # "write": a memset, which leaves the L2 full of dirty lines the timed kernel must evict
        # first; "read": a read of the whole buffer, which leaves only clean, unused lines.
        self.flush_mode = "read"
        # True: flush again between each run and its end event, so that the write-back of the
        # lines the run left dirty in the L2 is inside its time (lab/probes/drain.py)
        self.drain = False
        # True: each round starts one entrant later than the last (a rotation), so that no
        # entrant always runs in the same place of the round. The last places of a round time
        # 0.3-0.6 us faster than the others (at any place, whatever the kernel), so with a fixed
        # order the baselines, timed last, gained that on every run: at 4-5 us kernels, 10-15%
        # (bench/results/2026-12-04-h200-breadth, runs 4-5).
        self.rotate = True
        # One stream for everything: our kernels launch on it through cuda.core, and torch
        # runs on it as an external stream, so one event pair times either kind and no work
        # overlaps another entrant's timer.
        self.stream = self.dev.create_stream()
        self.ext = torch.cuda.ExternalStream(int(self.stream.handle))
        torch.cuda.set_stream(self.ext)

    def time_rounds(self, entrants: dict, reps: int) -> dict[str, list[float]]:
        """Interleaved rounds: for each round, every entrant once, L2 flushed before each run.
        A round is queued as a whole behind a short GPU sleep and synchronised once, so the
        host's launch cost (tens of microseconds for a Triton launch) stays off the timer:
        each event pair brackets only its entrant's work on the stream."""
        torch = self.torch
        samples = {k: [] for k in entrants}
        for fn in entrants.values():  # warm-up: modules loaded, clocks up
            fn()
            fn()
        torch.cuda.synchronize()
        ev = {
            k: (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for k in entrants
        }
        keys = list(entrants)
        for r in range(reps):
            torch.cuda._sleep(1_000_000)  # ~0.5 ms: the host queues the round meanwhile
            at = r % len(keys) if self.rotate else 0
            for k in keys[at:] + keys[:at]:
                fn = entrants[k]
                self.flush_l2(r)
                start, end = ev[k]
                start.record()
                fn()
                if self.drain:
                    self.flush_l2(r)
                end.record()
            torch.cuda.synchronize()
            for k in entrants:
                start, end = ev[k]
                samples[k].append(start.elapsed_time(end) * 1e3)
        return samples

    def flush_l2(self, r: int = 0) -> None:
        if self.flush_mode == "read":
            self.flush.sum(dtype=self.torch.int32)
        else:
            self.flush.fill_(r & 0xFF)

    def copy_ceiling_tbps(self, nbytes: int = 2 << 30) -> float:
        """A device-to-device copy's bytes read + written per second; with `drain`, the second
        flush's own time (timed alone in the same rounds) taken off the copy's."""
        torch = self.torch
        src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(0x3C)
        dst = torch.empty_like(src)
        entrants = {"copy": lambda: dst.copy_(src)}
        if self.drain:
            entrants["flush"] = lambda: None
        s = self.time_rounds(entrants, 10)
        us = float(np.median(s["copy"])) - (float(np.median(s["flush"])) if self.drain else 0.0)
        return 2 * nbytes / (us * 1e-6) / 1e12


def _torch_dtype(torch, dtype):
    return {
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
        "fp32": torch.float32,
        "int32": torch.int32,
        "int64": torch.int64,
    }[dtype]


def make_inputs(bench: Bench, w, dims: dict, seed: int) -> dict:
    """Inputs on the GPU drawn from the manifest's ranges (never zeros)."""
    torch = bench.torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    out = {}
    for t in w.inputs:
        shape = tuple(int(dims[d]) if isinstance(d, str) else int(d) for d in t.shape)
        if t.dtype in ("int32", "int64"):
            hi = int(dims[t.high]) if isinstance(t.high, str) else int(t.high)
            out[t.name] = torch.randint(
                int(t.low),
                hi,
                shape,
                generator=g,
                device="cuda",
                dtype=_torch_dtype(torch, t.dtype),
            )
        else:
            a = torch.rand(shape, generator=g, device="cuda", dtype=torch.float32)
            a = a * (float(t.high) - float(t.low)) + float(t.low)
            out[t.name] = a.to(_torch_dtype(torch, t.dtype))
    return out


def _to_storage_np(torch, t):
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).cpu().numpy().view(np.uint16)
    return t.cpu().numpy()


def check_rows(bench: Bench, w, ir, inputs: dict, outputs: dict, dims: dict) -> dict:
    """Every output element finite; sampled rows against the float64 reference."""
    from factory.spec import reference, to_float64

    torch = bench.torch
    rows_dim = ir.batch_dims[0]
    m = int(dims[rows_dim])
    rows = list(range(m)) if m <= 64 else sorted({r % m for r in SAMPLE_ROWS})
    sub = {}
    for t in w.inputs:
        a = inputs[t.name]
        if t.shape and t.shape[0] == rows_dim:
            a = a[rows]
        sub[t.name] = _to_storage_np(torch, a)
    ref = reference(w, sub, dict(dims) | {rows_dim: len(rows)})
    verdict = {"passed": True, "rel_err": 0.0, "reason": ""}
    for o in w.outputs:
        out = outputs[o.name]
        finite = bool(torch.isfinite(out.float()).all().item())
        got = to_float64(_to_storage_np(torch, out[rows]), o.dtype)
        want = np.asarray(ref[o.name], dtype=np.float64).reshape(got.shape)
        tol = w.tolerance[o.dtype]
        rel = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
        bad = int((~(np.abs(got - want) <= tol.atol + tol.rtol * np.abs(want))).sum())
        verdict["rel_err"] = max(verdict["rel_err"], rel)
        if not finite or rel > tol.rel_norm or bad:
            verdict["passed"] = False
            verdict["reason"] += f"{o.name}: finite={finite} rel={rel:.2e} bad={bad}; "
    return verdict


# Entrants that only move bytes (the ceilings and the drain's flush): timed, never checked.
BYTE_MOVERS = ("copy", "add_mix", "flush")


def torch_entrant(name: str, w, inputs: dict):
    """(run, {"version", "config"}, sink) of the torch-launched baseline `name` on `inputs`:
    run() leaves its outputs in sink["out"]. Raises gpuworker.baselines.Unavailable."""
    from gpuworker.baselines import make_torch_baseline

    fn, version, config = make_torch_baseline(name, w)
    sink: dict = {}

    def run():
        sink["out"] = fn(inputs)

    return run, {"version": version, "config": config}, sink


def our_launcher(bench: Bench, em, cubin: bytes, tensors: dict, dims: dict):
    """A no-argument function that launches the emitted kernel `em` (compiled into `cubin`) on
    bench's stream at `dims`, on the named device tensors (inputs and outputs by name); the
    grid, the arguments and the kernel are fixed once, here."""
    from cuda.core import ObjectCode, launch

    from gpuworker.gpu import launch_config

    kernel = ObjectCode.from_cubin(cubin).get_kernel(em.entry)
    grid = tuple(eval_dim_expr(g, dims) for g in em.launch.grid)
    cfg = launch_config(grid, em.launch.block, 0, em.launch.cluster)
    ptrs = {k: v.data_ptr() for k, v in tensors.items()}
    args = [ptrs[p.name] if p.kind == "tensor" else np.uint32(dims[p.name]) for p in em.params]

    def run():
        launch(bench.stream, cfg, kernel, *args)

    return run


def make_outputs(bench: Bench, w, dims: dict) -> dict:
    """The workload's output tensors at `dims`, uninitialised, on the GPU."""
    torch = bench.torch
    outputs = {}
    for o in w.outputs:
        shape = tuple(int(dims[d]) if isinstance(d, str) else int(d) for d in o.shape)
        outputs[o.name] = torch.empty(shape, dtype=_torch_dtype(torch, o.dtype), device="cuda")
    return outputs


def compiled_schedule(ir, s):
    """(emitted kernel, nvJitLink report, rejection reason or "") of schedule `s`; the PTX does
    not depend on the dims, so each schedule is emitted once per process."""
    from bench.suite import compile_cached

    key = (id(ir), s)
    if key not in _EMITTED:
        _EMITTED[key] = emit(ir, s)
    em = _EMITTED[key]
    rep = compile_cached(em.ptx)
    return em, rep, rejection_reason(rep, s.threads_per_block)


def case_buffers(bench: Bench, w, dims: dict) -> tuple[dict, dict, int]:
    """(inputs drawn afresh, uninitialised outputs, bytes they hold) of one case."""
    inputs = make_inputs(bench, w, dims, seed=int(time.time()) & 0xFFFF)
    outputs = make_outputs(bench, w, dims)
    nbytes = sum(t.numel() * t.element_size() for t in (*inputs.values(), *outputs.values()))
    return inputs, outputs, nbytes


def run_case(bench: Bench, w, ir, dims: dict, schedules, baselines, reps: int = 15) -> dict:
    """Our schedules and the baselines at one shape: verified, then timed interleaved."""
    torch = bench.torch
    inputs, outputs, nbytes = case_buffers(bench, w, dims)
    entrants, records = {}, []
    for s in dict.fromkeys(schedules):  # each schedule once, in order: entrants go by tag
        rec = {"impl": "ours", "tag": s.tag(), "schedule": s.to_dict()}
        em, rep, why = compiled_schedule(ir, s)
        rec["registers"] = rep.registers
        if why:
            records.append(rec | {"status": "rejected", "reason": why})
            continue
        run = our_launcher(bench, em, rep.cubin, inputs | outputs, dims)

        records.append(rec)
        entrants[f"ours:{s.tag()}"] = (run, rec, outputs)
    for name in baselines:
        from gpuworker.baselines import Unavailable

        rec = {"impl": name, "tag": name}
        if name == "copy":  # a device-to-device copy of the same bytes: the attainable here
            src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda").fill_(0x3C)
            dst = torch.empty_like(src)
            records.append(rec | {"config": {"bytes_read": nbytes // 2}})
            entrants[name] = (lambda dst=dst, src=src: dst.copy_(src), records[-1], None)
            continue
        if name == "add_mix":  # torch's a + b into c, each the outputs' size: reads 2, writes 1
            out_bytes = sum(t.numel() * t.element_size() for t in outputs.values())
            if nbytes != 3 * out_bytes:
                why = f"the case reads {nbytes - out_bytes} bytes and writes {out_bytes}, not 2:1"
                records.append(rec | {"status": "unavailable", "reason": why})
                continue
            a, b, c = (
                torch.empty(out_bytes // 2, dtype=torch.bfloat16, device="cuda").fill_(0.5)
                for _ in range(3)
            )
            mix = {"bytes_read": 2 * out_bytes, "bytes_written": out_bytes}
            records.append(rec | {"config": mix})
            entrants[name] = (lambda a=a, b=b, c=c: torch.add(a, b, out=c), records[-1], None)
            continue
        extra = next((f for pre, f in EXTRA_ENTRANTS.items() if name.startswith(pre)), None)
        if extra is not None:  # an entrant a lab experiment registered (lab/probes/mover.py)
            try:
                run, cfg, box = extra(bench, name, w, inputs, outputs)
            except ValueError as e:
                records.append(rec | {"status": "unavailable", "reason": str(e)})
                continue
            records.append(rec | {"config": cfg})
            entrants[name] = (run, records[-1], box)
            continue
        if name == "flush":  # nothing: with Bench.drain, the second flush's own time
            records.append(rec | {"config": {"runs": "nothing"}})
            entrants[name] = (lambda: None, records[-1], None)
            continue
        try:
            run, info, box = torch_entrant(name, w, inputs)
        except Unavailable as e:
            records.append(rec | {"status": "unavailable", "reason": str(e)})
            continue
        rec |= info
        records.append(rec)
        entrants[name] = (run, rec, box)
    judge(bench, w, ir, dims, inputs, outputs, entrants, nbytes, reps)
    return {"dims": dims, "bytes": nbytes, "records": records}


def judge(bench: Bench, w, ir, dims, inputs, outputs, entrants: dict, nbytes: int, reps: int):
    """Verify, then time, every entrant {key: (run, record, sink)}, filling in its record.

    An entrant whose record's impl is "ours" (or any impl in OWN_OUTPUTS) writes into `outputs`;
    a baseline returns its outputs into sink["out"]; a byte mover is not checked. Each is
    poisoned, run and checked first; the verified ones are timed in interleaved rounds (none
    with reps=0: a held-out shape) and the ones writing into `outputs` checked again after."""
    torch = bench.torch
    # Verify each entrant: poison, run, check (ours write into `outputs`; baselines return).
    live = {}
    for key, (run, rec, sink) in entrants.items():
        try:
            for t in outputs.values():
                t.fill_(float("nan"))
            run()
            torch.cuda.synchronize()
            if rec["impl"] in BYTE_MOVERS or rec["impl"].startswith("mover:"):  # nothing to check
                rec["verified"] = True
                live[key] = run
                continue
            outs = outputs if rec["impl"] in OWN_OUTPUTS else sink["out"]
            v = check_rows(bench, w, ir, inputs, outs, dims)
            rec |= {"verified": v["passed"], "rel_err": v["rel_err"], "reason": v["reason"]}
            if v["passed"]:
                live[key] = run
            else:
                rec["status"] = "failed"
        except Exception as e:  # noqa: BLE001 - a crash is a result
            rec |= {"status": "crashed", "verified": False, "reason": str(e)[:300]}
            if rec["impl"] in OWN_OUTPUTS:
                break  # the context may be gone
    if reps == 0:  # a held-out shape: verified only
        for key in live:
            entrants[key][1]["status"] = "verified"
        return
    samples = bench.time_rounds(live, reps) if live else {}
    # Check again after timing: the timed runs' outputs must still be right.
    for key, (run, rec, _sink) in entrants.items():
        if key not in samples:
            continue
        if rec["impl"] in OWN_OUTPUTS:
            for t in outputs.values():
                t.fill_(float("nan"))
            run()
            torch.cuda.synchronize()
            again = check_rows(bench, w, ir, inputs, outputs, dims)
            if not again["passed"]:
                rec |= {"status": "failed", "reason": "after timing: " + again["reason"]}
                continue
        xs = samples[key]
        med = float(np.median(xs))
        rec |= {
            "status": "passed",
            "median_us": med,
            "p20_us": float(np.percentile(xs, 20)),
            "p80_us": float(np.percentile(xs, 80)),
            "samples_us": [round(x, 3) for x in xs],
            "tbps": nbytes / (med * 1e-6) / 1e12,
        }


def geomean(xs) -> float:
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def environment() -> dict:
    """GPU, driver, clocks and versions, for the record."""
    import subprocess
    from datetime import UTC, datetime

    import torch

    from gpuworker.env import software_versions

    env = {"gpu": torch.cuda.get_device_name(), "started_at": datetime.now(UTC).isoformat()}
    try:
        q = "driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw"
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
        drv, sm, smmax, temp, power = (x.strip() for x in out.split(","))
        env |= {"driver": drv, "sm_clock_mhz": sm, "max_sm_clock_mhz": smmax, "temp_c": temp}
        env["power_w"] = power
    except Exception as e:  # noqa: BLE001 - recorded as unknown
        env["nvidia_smi_error"] = str(e)
    return env | software_versions()


def as_results(op: str, cases: list[dict], ceiling: float, env: dict) -> dict:
    """Direct-mode cases in the shape of a gpuworker results file, so one report reads both."""
    cands, bases = {}, {}
    for case in cases:
        for rec in case["records"]:
            ours = rec["impl"] == "ours"
            key = f"{op}:{rec['tag']}" if ours else rec["impl"]
            book = cands if ours else bases
            entry = book.setdefault(
                key,
                {("id" if ours else "name"): key, "status": "passed", "reason": "", "timing": []},
            )
            if rec.get("status") == "verified":  # a held-out shape, checked and not timed
                entry.setdefault("heldout_verified", []).append(case["dims"])
                continue
            if rec.get("status") != "passed":
                entry["status"] = rec.get("status", "failed")
                entry["reason"] += f"{case['dims']}: {rec.get('reason', '')} "
                continue
            entry["timing"].append(
                {
                    "dims": case["dims"],
                    "median_us": rec["median_us"],
                    "p20_us": rec["p20_us"],
                    "p80_us": rec["p80_us"],
                    "tbps": rec["tbps"],
                    "bytes": case["bytes"],
                    "samples_us": rec["samples_us"],
                }
            )
            if ours:
                entry["schedule"] = rec["schedule"]
                entry["registers"] = rec.get("registers")
            entry["rel_err"] = max(entry.get("rel_err", 0.0), rec.get("rel_err", 0.0))
    return {
        "format": 1,
        "mode": "direct",
        "env": env,
        "copy_ceiling_tbps": ceiling,
        "candidates": list(cands.values()),
        "baselines": list(bases.values()),
        "suite": {"op": op},
    }
