"""Two checks of the GPU worker's timing, recorded under bench/results/.

    PYTHONPATH=. python3 lab/probes/timer_check.py --out DIR [timer] [throughput]

timer: for each suite operator (first suite shape), the worker times the torch eager and plain
Triton baselines, one of our generated kernels (the emitter's default layout, row "ours:<tag>"),
and for softmax an honest hand-written PTX kernel, inside run_batch; then this process times the
very same functions with triton.testing.do_bench (its own L2 flush, median): the baselines
called as the worker calls them, the PTX kernels as the same cubin (same PTX, arch and nvJitLink
call) launched with the same launch description through cuda.core, on a stream torch also runs
on, so do_bench's events and flush bracket the launch. The two medians should agree within 5%.
do_bench flushes the L2 by WRITING a buffer (cache.zero_()), which leaves dirty lines the timed
kernel must write back; the worker's default flush reads instead (batch option l2_flush =
"read", a few us less of foreign traffic per run). So this check runs the worker with
l2_flush = "write": like with like. Writes DIR/timer.json and DIR/timer.md.

throughput: one batch of 50 honest PTX candidates for the catalogue softmax at the suite shapes
plus one kernel that never finishes, verified and timed end to end. The figure is the batch's
wall time (target: under two minutes) and what the hang cost (its time limit, plus the switch to
the worker's warm standby child: env.restart_log).
Writes DIR/throughput.json and DIR/throughput.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
FIXTURES = ROOT / "tests" / "fixtures" / "redteam"

# The suite operators (bench/suite.py); each is timed at its first suite shape.
SUITE_OPS = (
    "softmax",
    "layernorm",
    "rmsnorm",
    "add_rmsnorm",
    "silu_mul",
    "gelu_tanh",
    "cross_entropy",
)
# The worker's flush for the timer check: the one do_bench uses (it writes its flush buffer).
TIMER_L2_FLUSH = "write"
SUITE_SOFTMAX_SHAPES = [{"M": 16384, "N": 4096}, {"M": 16384, "N": 8192}, {"M": 32768, "N": 4096}]
OURS_PREFIX = "ours:"
_ARG_TYPES = {
    "u32": np.uint32,
    "u64": np.uint64,
    "s32": np.int32,
    "s64": np.int64,
    "f32": np.float32,
    "f64": np.float64,
}


def _log(t0):
    return lambda m: print(f"[{time.monotonic() - t0:6.1f}] {m}", file=sys.stderr, flush=True)


def _honest_candidate(cid: str, w, block: int, entry="honest_bf16") -> dict:
    x, y = w.inputs[0].name, w.outputs[0].name
    return {
        "id": cid,
        "ptx": (FIXTURES / f"{entry}.ptx").read_text(),
        "entry": entry,
        "params": [
            {"kind": "tensor", "ptx_type": "u64", "name": x},
            {"kind": "tensor", "ptx_type": "u64", "name": y},
            {"kind": "dim", "ptx_type": "u32", "name": "M"},
            {"kind": "dim", "ptx_type": "u32", "name": "N"},
        ],
        "launch": {"grid": ["M", 1, 1], "block": [block, 1, 1], "smem_bytes": 0, "cluster": None},
    }


def _softmax_ok(w) -> bool:
    return (
        len(w.inputs) == 1
        and len(w.outputs) == 1
        and w.inputs[0].dtype == "bf16"
        and w.outputs[0].dtype == "bf16"
    )


def _torch_inputs(w, dims, seed):
    import torch

    from factory.spec import random_inputs

    out = {}
    for name, a in random_inputs(w, dims, seed).items():
        if a.dtype == np.uint16:
            out[name] = torch.from_numpy(a.view(np.int16)).cuda().view(torch.bfloat16)
        else:
            out[name] = torch.from_numpy(a).cuda()
    return out


def do_bench_us(fn) -> float:
    from triton.testing import do_bench

    return 1000.0 * do_bench(fn, warmup=100, rep=400, return_mode="median")


def ours_candidate(w, dims: dict) -> dict | None:
    """One of our generated kernels for workload `w` at `dims` as a format-1 batch candidate: the
    emitter's default layout, screened as the suite screens (a valid layout that compiles with no
    spills, no stack, registers within the file). None when it does not pass the screen."""
    from factory.compile import compile_ptx, rejection_reason
    from factory.emit import emit
    from factory.families.row.ir import lower
    from factory.families.row.schedules import default_schedule, is_valid

    ir = lower(w)
    s = default_schedule(ir, dims)
    if not is_valid(ir, s, dims)[0]:
        return None
    em = emit(ir, s)
    if rejection_reason(compile_ptx(em.ptx), s.threads_per_block):
        return None
    params = []
    for p in em.params:
        param = {"kind": p.kind, "ptx_type": p.ptx_type, "name": p.name}
        if p.kind == "scalar":
            param["value"] = p.value
        params.append(param)
    return {
        "id": f"{OURS_PREFIX}{s.tag()}",
        "ptx": em.ptx,
        "entry": em.entry,
        "params": params,
        "launch": {
            "grid": list(em.launch.grid),
            "block": list(em.launch.block),
            "smem_bytes": em.launch.smem_bytes,
            "cluster": list(em.launch.cluster) if em.launch.cluster else None,
        },
    }


def timer_batch(name: str, w, dims: dict, manifest: str) -> dict:
    """The batch the timer check gives the worker for one operator at one shape."""
    cands = (
        [_honest_candidate("honest_bf16", w, 256)] if name == "softmax" and _softmax_ok(w) else []
    )
    ours = ours_candidate(w, dims)
    if ours is not None:
        cands.append(ours)
    return {
        "format": 1,
        "batch_id": f"timer-{name}-{uuid.uuid4()}",
        "manifest": manifest,
        "shapes": [dims],
        "heldout_shapes": [],
        "candidates": cands,
        "baselines": ["torch_eager", "triton"],
        "options": {
            "time_budget_s_per_candidate": 0.3,
            "timeout_s_per_candidate": 30,
            # do_bench's L2 flush writes; the worker's default reads. Compare like with like.
            "l2_flush": TIMER_L2_FLUSH,
        },
    }


def run_timer(out: Path, ops: list[str] | None) -> list[dict]:
    from factory.spec import catalogue_manifest, load_catalogue
    from gpuworker import run_batch
    from gpuworker.baselines import Unavailable, make_torch_baseline

    t0 = time.monotonic()
    log = _log(t0)
    cat = load_catalogue()
    names = [n for n in SUITE_OPS if n in cat and (not ops or n in ops)]
    rows, raw = [], []
    shared = None  # (cuda.core stream, the same stream as torch sees it), made once torch is up
    for name in names:
        w = cat[name]
        dims = dict(cat[name].shapes[0])
        batch = timer_batch(name, w, dims, catalogue_manifest(name))
        by_id = {c["id"]: c for c in batch["candidates"]}
        if not any(cid.startswith(OURS_PREFIX) for cid in by_id):
            rows.append(
                {"op": name, "dims": dims, "what": OURS_PREFIX, "note": "no generated kernel"}
            )
        log(f"{name}: run_batch")
        try:
            res = run_batch(batch, log=log)
        except Exception as e:  # noqa: BLE001 - one operator's failure must not hide the rest
            rows.append({"op": name, "dims": dims, "what": "run_batch", "note": repr(e)[:200]})
            _write_timer(out, rows, raw)
            continue
        raw.append(res)
        import torch

        inputs = _torch_inputs(w, dims, 1234)
        if shared is None:
            shared = _shared_stream()
        entrants = [(b["name"], b) for b in res["baselines"]] + [
            (c["id"], c) for c in res["candidates"]
        ]
        for label, rec in entrants:
            if rec["status"] != "passed":
                rows.append(
                    {
                        "op": name,
                        "dims": dims,
                        "what": label,
                        "ours_us": None,
                        "do_bench_us": None,
                        "ratio": None,
                        "note": f"{rec['status']}: {rec['reason'][:80]}",
                    }
                )
                continue
            ours = rec["timing"][0]["median_us"]
            note = ""
            stream_ctx = contextlib.nullcontext()
            if label in by_id:  # a PTX candidate: the same cubin, launched on our stream
                try:
                    fn, outputs = _candidate_fn(by_id[label], w, dims, inputs, shared[0])
                    note = _eager_check(w, fn, inputs, outputs, shared[1])
                except Exception as e:  # noqa: BLE001 - recorded, the rest goes on
                    rows.append({"op": name, "dims": dims, "what": label, "note": repr(e)[:200]})
                    continue
                # torch (so do_bench: its events and L2 flush) runs on the launch's stream
                stream_ctx = torch.cuda.stream(shared[1])
            else:
                try:
                    f, _, _ = make_torch_baseline(label, w)
                except Unavailable as e:
                    rows.append({"op": name, "what": label, "note": str(e)})
                    continue
                fn = lambda f=f, d=inputs: f(d)  # noqa: E731
            try:
                with stream_ctx:
                    theirs = do_bench_us(fn)
            except Exception as e:  # noqa: BLE001 - recorded, the rest goes on
                rows.append({"op": name, "dims": dims, "what": label, "note": repr(e)[:200]})
                continue
            rows.append(
                {
                    "op": name,
                    "dims": dims,
                    "what": label,
                    "ours_us": ours,
                    "do_bench_us": theirs,
                    "ratio": ours / theirs,
                    "ours_p20_us": rec["timing"][0]["p20_us"],
                    "ours_p80_us": rec["timing"][0]["p80_us"],
                    "note": note,
                }
            )
            log(f"{name} {label}: ours {ours:.1f} us, do_bench {theirs:.1f} us")
        inputs = fn = outputs = None  # the tensors go before the next operator's
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        _write_timer(out, rows, raw)  # partial results survive a time limit
    _write_timer(out, rows, raw)
    return rows


def _write_timer(out: Path, rows: list[dict], raw: list[dict]):
    (out / "timer.json").write_text(json.dumps({"rows": rows, "results": raw}, indent=1))
    lines = [
        "# Worker timing vs triton.testing.do_bench (median, same function, same shape)",
        "",
        f'The worker ran with `l2_flush = "{TIMER_L2_FLUSH}"`: do_bench flushes the L2 by writing '
        "a buffer (`cache.zero_()`), so the worker flushes the same way here. Its default flush "
        "reads the buffer instead, which leaves no dirty lines for the timed kernel to write "
        "back; default-flush medians are typically a few microseconds lower than these.",
        "",
        "| operator | shape | function | worker median us (p20-p80) | do_bench median us "
        "| worker/do_bench | within 5% |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("ratio") is None:
            lines.append(
                f"| {r['op']} | {r.get('dims', '')} | {r['what']} | - | - | - | {r['note']} |"
            )
            continue
        lines.append(
            f"| {r['op']} | {_dims(r['dims'])} | {r['what']} | {r['ours_us']:.1f} "
            f"({r['ours_p20_us']:.1f}-{r['ours_p80_us']:.1f}) | {r['do_bench_us']:.1f} | "
            f"{r['ratio']:.3f} | {'yes' if abs(r['ratio'] - 1) <= 0.05 else '**no**'} |"
            + (f" {r['note']} |" if r.get("note") else "")
        )
    md = "\n".join(lines) + "\n"
    (out / "timer.md").write_text(md)


def _dims(d: dict) -> str:
    return "x".join(str(v) for v in d.values())


def _shared_stream():
    """A cuda.core stream and the same stream as torch sees it (an external stream): our kernels
    launch on it, and do_bench, run under `torch.cuda.stream(...)`, records its events and
    flushes the L2 on it, so every timed interval brackets exactly the launch."""
    import torch
    from cuda.core import Device

    dev = Device()
    dev.set_current()  # the primary context, which torch uses too
    stream = dev.create_stream()
    return stream, torch.cuda.ExternalStream(int(stream.handle))


_TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "int32": "int32",
                 "int64": "int64"}  # fmt: skip


def _candidate_fn(cand: dict, w, dims: dict, inputs: dict, stream):
    """(launch, outputs): a no-argument launcher of the batch candidate `cand` at `dims` on the
    cuda.core `stream`, over `inputs` (torch tensors by name) and fresh output tensors. The cubin
    is the worker's: the same PTX through the same compile_ptx call for the device's arch, and
    the launch is the worker's (child.py): grid from the launch's dim expressions, its block and
    dynamic shared memory, and the parameters bound by kind (tensor, dim, scalar)."""
    import torch
    from cuda.core import Device, LaunchConfig, ObjectCode, launch

    from factory.compile import compile_ptx
    from factory.spec import eval_dim_expr
    from gpuworker import gpu
    from gpuworker.runner import _compile_arch

    dev = Device()
    cc = dev.compute_capability
    rep = compile_ptx(cand["ptx"], _compile_arch(cand["ptx"], f"sm_{cc.major}{cc.minor}"))
    if not rep.ok:
        raise RuntimeError(f"nvJitLink refused the PTX: {rep.log.strip()[-300:]}")
    kernel = ObjectCode.from_cubin(rep.cubin).get_kernel(cand["entry"])
    outputs = {
        o.name: torch.empty(
            tuple(int(dims[d]) if isinstance(d, str) else int(d) for d in o.shape),
            dtype=getattr(torch, _TORCH_DTYPES[o.dtype]),
            device="cuda",
        )
        for o in w.outputs
    }
    tensors = {**inputs, **outputs}
    args = []
    for p in cand["params"]:
        if p["kind"] == "tensor":
            args.append(tensors[p["name"]].data_ptr())
        elif p["kind"] == "dim":
            args.append(_ARG_TYPES[p["ptx_type"]](dims[p["name"]]))
        else:
            args.append(_ARG_TYPES[p["ptx_type"]](p.get("value", 0.0)))
    ld = cand["launch"]
    grid = tuple(int(eval_dim_expr(g, dims)) for g in ld["grid"])
    block = tuple(int(b) for b in ld["block"])
    smem = int(eval_dim_expr(ld.get("smem_bytes") or 0, dims))
    if smem > 48 * 1024:
        gpu.set_max_dynamic_smem(kernel, smem, dev.device_id)
    cluster = ld.get("cluster")
    if cluster:
        cfg = LaunchConfig(
            grid=tuple(g // c for g, c in zip(grid, cluster, strict=True)),
            cluster=tuple(cluster),
            block=block,
            shmem_size=smem,
        )
    else:
        cfg = LaunchConfig(grid=grid, block=block, shmem_size=smem)
    args = tuple(args)
    # The inputs and outputs were made on torch's default stream, which our (non-blocking)
    # stream does not wait for.
    torch.cuda.synchronize()
    return (lambda: launch(stream, cfg, kernel, *args)), outputs


def _eager_check(w, fn, inputs: dict, outputs: dict, ext_stream) -> str:
    """One launch of `fn`, its outputs compared with torch eager's (both within the manifest's
    tolerance of the float64 reference, so within twice it of each other): a launch set up
    wrong here would otherwise be timed without anyone noticing. "" when they agree."""
    import torch

    from gpuworker.baselines import Unavailable, make_torch_baseline

    try:
        eager, _, _ = make_torch_baseline("torch_eager", w)
    except Unavailable as e:
        return f"not checked: {e}"
    with torch.cuda.stream(ext_stream):  # our stream does not wait for torch's default one
        for t in outputs.values():
            if t.is_floating_point():
                t.fill_(float("nan"))
        fn()
        want = eager(inputs)
    torch.cuda.synchronize()
    bad = []
    for o in w.outputs:
        got = outputs[o.name].double()
        ref = want[o.name].reshape(got.shape).double()
        rel = float((got - ref).norm() / ref.norm().clamp_min(1e-30))
        if not bool(torch.isfinite(got).all()) or rel > 2 * w.tolerance[o.dtype].rel_norm:
            bad.append(f"{o.name} differs from torch eager (rel {rel:.1e})")
    return "; ".join(bad)


def run_throughput(
    out: Path, n_honest: int = 50, timeout_s: float = 5.0, budget_s: float = 0.5
) -> dict:
    from factory.spec import catalogue_manifest, load_catalogue
    from gpuworker import run_batch

    w = load_catalogue()["softmax"]
    if not _softmax_ok(w):
        raise SystemExit("the catalogue softmax is not bf16 -> bf16; honest_bf16 does not fit it")
    blocks = [128, 256, 512, 1024]
    cands = [
        _honest_candidate(f"honest-{i:02d}-b{blocks[i % 4]}", w, blocks[i % 4])
        for i in range(n_honest)
    ]
    hang = _honest_candidate("hang", w, 256, entry="infinite_loop")
    cands.insert(n_honest // 2, hang)
    heldout = list(w.heldout_shapes) or [{"M": 1, "N": 4095}, {"M": 37, "N": 1000}]
    batch = {
        "format": 1,
        "batch_id": f"throughput-{uuid.uuid4()}",
        "manifest": catalogue_manifest("softmax"),
        "shapes": SUITE_SOFTMAX_SHAPES,
        "heldout_shapes": heldout,
        "candidates": cands,
        "baselines": [],
        "options": {"time_budget_s_per_candidate": budget_s, "timeout_s_per_candidate": timeout_s},
    }
    t0 = time.monotonic()
    res = run_batch(batch, log=_log(t0))
    wall = time.monotonic() - t0
    status = {}
    for c in res["candidates"]:
        status[c["status"]] = status.get(c["status"], 0) + 1
    hang_rec = next(c for c in res["candidates"] if c["id"] == "hang")
    honest = [c for c in res["candidates"] if c["id"] != "hang"]
    med: dict[str, list] = {}
    for c in honest:
        for t in c["timing"]:
            med.setdefault(_dims(t["dims"]), []).append(t["tbps"])
    summary = {
        "wall_s": wall,
        "candidates": len(cands),
        "statuses": status,
        "hang_status": hang_rec["status"],
        "hang_reason": hang_rec["reason"],
        "hang_verify_wall_s": hang_rec.get("verify_wall_s"),
        "timeout_s": timeout_s,
        "restart_s": res["env"].get("restart_s"),
        "restart_log": res["env"].get("restart_log"),
        "warm_spare": res["env"].get("warm_spare"),
        "copy_ceiling_tbps": res["copy_ceiling_tbps"],
        "honest_tbps_median_by_shape": {k: float(np.median(v)) for k, v in med.items()},
    }
    (out / "throughput.json").write_text(json.dumps({"summary": summary, "results": res}, indent=1))
    md = (
        "# Throughput: 50 honest candidates + 1 hanging kernel, softmax bf16, suite shapes\n\n"
        f"- batch wall time: **{wall:.1f} s** (target < 120 s) for {len(cands)} candidates, "
        f"3 benchmarked shapes + {len(heldout)} held-out shapes, verified twice each and timed\n"
        f"- statuses: {status}\n"
        f"- timing budget {budget_s} s per candidate\n"
        f"- hanging kernel: {hang_rec['status']} after {hang_rec.get('verify_wall_s')} s "
        f"(time limit {timeout_s} s); worker restart(s) took {res['env'].get('restart_s')} s "
        f"(warm spare {res['env'].get('warm_spare')}: {res['env'].get('restart_log')})\n"
        f"- copy ceiling {res['copy_ceiling_tbps']:.2f} TB/s; honest kernels' median TB/s by "
        f"shape: {summary['honest_tbps_median_by_shape']}\n"
    )
    (out / "throughput.md").write_text(md)
    print(md)
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", nargs="*", default=["timer", "throughput"])
    p.add_argument("--out", default=".")
    p.add_argument("--ops", nargs="*")
    p.add_argument("--budget", type=float, default=0.5, help="throughput: timing s per candidate")
    p.add_argument("--timeout", type=float, default=5.0, help="throughput: s per candidate")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if "throughput" in args.what:
        run_throughput(out, timeout_s=args.timeout, budget_s=args.budget)
    if "timer" in args.what:
        run_timer(out, args.ops)
    return 0


if __name__ == "__main__":
    sys.exit(main())
