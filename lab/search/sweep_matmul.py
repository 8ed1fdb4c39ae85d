"""The tensor-core family's sweep for the search benchmark (issue 53): every valid schedule of the
matmul space, checked and timed at each of a few shapes, with what each cost.

    PYTHONPATH=. python3 -m lab.search.sweep_matmul --out DIR [--budget-s 175] [--reps 10]

The workload is factory/examples/matmul_bias_gelu.toml (y = gelu_tanh(x @ w.T + bias), bf16):
its space (factory.families.matmul.space) at each shape of --shapes (default: a decode-like
128 x 4096 x 4096, a square 4096^3, an MLP up-projection 2048 x 11008 x 4096 and a wide-M
8192 x 2048 x 2048). The kernels are rendered from lab.matmul.variants' `bias_gelu` IR, the same
operator under the names lab.matmul.gemm_bench's functions bind (its space is the same set of
schedules, which `main` asserts).

1. Every schedule emitted and compiled with nvJitLink (sm_90a) in background threads, in the
   seeded random order the GPU takes them, so the GPU starts on the first chunk while the rest
   compile; each schedule's emit-and-compile seconds.
2. In chunks of --chunk schedules of that order, each chunk at every shape in turn (a run cut
   short by --budget-s leaves the same uniform sample at every shape): each schedule's output
   checked against a float64 reference first (gemm_bench.check: NaN-poisoned output, two runs
   bitwise equal; one set of inputs and its reference per shape, shared by every schedule,
   `share_inputs`), then the chunk's passing kernels timed with torch (cuBLAS)
   interleaved (gemm_bench.time_pair: L2 flush before every run, median of --reps). A
   schedule's check seconds are measured; its timing seconds are its share of the chunk's
   timing wall time, in proportion to its median.
3. $OUT/sweep_matmul.json (format "matmul-sweep-1"), rewritten after every chunk, and a table
   of each shape's best, median and worst schedule last.

lab.search.replay reads the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

FORMAT = "matmul-sweep-1"
MANIFEST = "factory/examples/matmul_bias_gelu.toml"
OP = "bias_gelu"  # lab.matmul.variants / gemm_bench's name for the same operator
SHAPES = "128x4096x4096,4096x4096x4096,2048x11008x4096,8192x2048x2048"


def parse_shapes(text: str) -> list[dict]:
    out = []
    for part in text.split(","):
        if part.strip():
            m, n, k = (int(x) for x in part.strip().split("x"))
            out.append({"M": m, "N": n, "K": k})
    return out


def manifest_workload(shapes: list[dict], manifest: str = MANIFEST):
    """The example workload (`manifest`, a path) with `shapes` as its shapes (the schedules the
    agents propose for it are the ones this sweep times)."""
    from factory.spec import load_manifest

    with open(manifest) as f:
        text = f.read()
    head = text[: text.index("[[shapes]]")]
    rows = "".join(f"[[shapes]]\nM = {d['M']}\nN = {d['N']}\nK = {d['K']}\n\n" for d in shapes)
    return load_manifest(head + rows)


def space_schedules(shapes: list[dict], manifest: str = MANIFEST) -> list[dict]:
    """Every schedule of the workload's space valid at every shape, as evidence dicts."""
    from factory import families

    fam, ir = families.family_for(manifest_workload(shapes, manifest))
    return [s.to_dict() for s in fam.space(ir, [dict(d) for d in shapes])]


def schedule_key(schedule: dict) -> str:
    """A schedule's identity across IRs: its fields without the family and problem names."""
    return json.dumps(
        {k: v for k, v in schedule.items() if k not in ("family", "problem")}, sort_keys=True
    )


def start_compiles(ir, schedules: list[dict], order: list[int], threads: int):
    """Emit and compile every schedule for sm_90a in the background, in `order` (the order the
    GPU will want them): {id: future of {ok, compile_s, registers, spills, error, schedule,
    emitted, report}}. Emission holds a lock (one at a time); nvJitLink releases the GIL, so the
    compiles run side by side, and beside the GPU work on the schedules already compiled.
    compile_s is the schedule's emit and compile seconds."""
    import threading

    from factory.compile import compile_ptx
    from factory.families.matmul import emit as gemm_emit
    from factory.families.matmul.schedule import GemmSchedule

    fields = GemmSchedule.__dataclass_fields__
    lock = threading.Lock()

    def one(sched: dict) -> dict:
        t0 = time.monotonic()
        try:
            s = GemmSchedule(**{k: v for k, v in sched.items() if k in fields})
            with lock:
                e = gemm_emit.emit(ir, s)
            r = compile_ptx(e.ptx, "sm_90a", cache=False)
        except Exception as exc:  # noqa: BLE001 - recorded per schedule
            return {"ok": False, "compile_s": time.monotonic() - t0, "error": str(exc)[:500]}
        out = {
            "ok": bool(r.ok),
            "compile_s": round(time.monotonic() - t0, 4),
            "registers": r.registers,
            "spills": r.spill_store_bytes,
            "error": "" if r.ok else r.log[-500:],
        }
        if r.ok:
            out.update(schedule=s, emitted=e, report=r)
        return out

    pool = ThreadPoolExecutor(max_workers=max(1, threads))
    futures = {i: pool.submit(one, schedules[i]) for i in order}
    pool.shutdown(wait=False)
    return futures


def compile_all(ir, schedules: list[dict], threads: int) -> list[dict]:
    """start_compiles for every schedule, waited for: the results in the schedules' order."""
    futures = start_compiles(ir, schedules, list(range(len(schedules))), threads)
    return [futures[i].result() for i in range(len(schedules))]


def make_kernel(gb, ir, compiled: dict):
    """A gemm_bench.Kernel from an already compiled schedule (Kernel's own constructor compiles
    serially, which for a whole space takes minutes)."""
    from cuda.bindings import driver as cu

    k = gb.Kernel.__new__(gb.Kernel)
    k.ir, k.s, k.em, k.report = ir, compiled["schedule"], compiled["emitted"], compiled["report"]
    k.compiler = "nvjitlink"  # start_compiles compiles as the worker does
    k.setmaxnreg_ignored = "C7504" in k.report.log
    err, k.mod = cu.cuModuleLoadData(k.report.cubin)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"module load: {err}")
    err, k.fn = cu.cuModuleGetFunction(k.mod, k.em.entry.encode())
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"function: {err}")
    (err,) = cu.cuFuncSetAttribute(
        k.fn,
        cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        k.em.launch.smem_bytes,
    )
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"smem attribute: {err}")
    k._args = None
    return k


def schedule_order(n_sched: int, seed: int) -> list[int]:
    """The order the schedules are compiled and measured in: seeded, random."""
    ids = list(range(n_sched))
    random.Random(seed).shuffle(ids)
    return ids


def chunks_round_robin(n_sched: int, n_shapes: int, chunk: int, seed: int) -> list[tuple]:
    """(shape index, [schedule ids]) work units: the ids in schedule_order, cut into chunks;
    each chunk at every shape in turn before the next chunk (a run cut short leaves the same
    uniform sample at every shape, and needs only the chunks it reached compiled)."""
    ids = schedule_order(n_sched, seed)
    out = []
    for start in range(0, n_sched, chunk):
        for si in range(n_shapes):
            out.append((si, ids[start : start + chunk]))
    return out


def share_inputs(gb) -> None:
    """gemm_bench.check draws fresh inputs and computes the float64 reference on every call;
    for a whole space that is most of the GPU time. Here the inputs of one (operator, shape,
    seed) and their reference are made once and every schedule's output is checked against
    them (check still NaN-poisons the output before each of its two runs)."""
    make, ref = gb.make_inputs, gb.reference
    inputs: dict = {}
    refs: dict = {}

    def make_inputs(torch, name, m, n, k, gen):
        key = (name, m, n, k, gen.initial_seed())
        if key not in inputs:
            inputs.clear()
            refs.clear()
            inputs[key] = make(torch, name, m, n, k, gen)
        return inputs[key]

    def reference(torch, name, t):
        if id(t) not in refs:
            refs[id(t)] = ref(torch, name, t)
        return refs[id(t)]

    gb.make_inputs, gb.reference = make_inputs, reference


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--chunk", type=int, default=160)
    ap.add_argument("--budget-s", type=float, default=175.0, help="stop starting chunks after")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 8)
    ap.add_argument("--limit", type=int, default=0, help="only the first N schedules (a trial)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    start = time.monotonic()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "sweep_matmul.json")

    import lab.matmul.gemm_bench as gb
    from factory.families.matmul import space as mm_space
    from lab.matmul.variants import epilogue_irs

    gb.save = lambda: None  # its results file is not this sweep's; ours is written per chunk
    share_inputs(gb)
    shapes = parse_shapes(args.shapes)
    schedules = space_schedules(shapes)
    ir = epilogue_irs()[OP]
    lab_keys = {schedule_key(s.to_dict()) for s in mm_space.space(ir, shapes)}
    assert lab_keys == {schedule_key(s) for s in schedules}, "the two IRs' spaces differ"
    if args.limit:
        schedules = schedules[: args.limit]
    out: dict = {
        "format": FORMAT,
        "manifest": MANIFEST,
        "op": OP,
        "shapes": shapes,
        "reps": args.reps,
        "seed": args.seed,
        "schedules": schedules,
        "compile": [],
        "measurements": [],
        "torch": [],
        "errors": [],
        "complete": False,
    }

    def save():
        out["wall_s"] = round(time.monotonic() - start, 2)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out, f)
        os.replace(tmp, path)

    futures = start_compiles(ir, schedules, schedule_order(len(schedules), args.seed), args.threads)
    compile_recs: dict[int, dict] = {}

    import torch

    dev = torch.cuda.get_device_properties(0)
    out["env"] = {
        "gpu": dev.name,
        "sms": dev.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "sm_clock_mhz": gb.sm_clock(),
    }
    torch.zeros(1, device="cuda")
    from cuda.bindings import driver as cu

    cu.cuInit(0)
    _, ctx = cu.cuDevicePrimaryCtxRetain(cu.CUdevice(torch.cuda.current_device()))
    cu.cuCtxSetCurrent(ctx)
    kernels: dict[int, object] = {}

    def kernel(i: int):
        """Schedule i's loaded kernel once its compile is done (None if it failed)."""
        if i not in compile_recs:
            c = futures[i].result()
            compile_recs[i] = {
                "id": i,
                **{k: v for k, v in c.items() if k not in ("schedule", "emitted", "report")},
            }
            if c["ok"]:
                try:
                    kernels[i] = make_kernel(gb, ir, c)
                except Exception as exc:  # noqa: BLE001
                    out["errors"].append(f"load {i}: {exc}")
        return kernels.get(i)

    work = chunks_round_robin(len(schedules), len(shapes), args.chunk, args.seed)
    done_units = 0
    for unit, (si, ids) in enumerate(work):
        if time.monotonic() - start > args.budget_s:
            print(f"budget reached after {done_units} of {len(work)} chunks", flush=True)
            break
        d = shapes[si]
        m, n, k = d["M"], d["N"], d["K"]
        passing: dict[str, object] = {}
        rows: dict[int, dict] = {}
        for i in ids:
            rec = {"id": i, "dims": d, "status": "not_compiled", "median_us": None}
            rows[i] = rec
            if kernel(i) is None:
                continue
            t1 = time.monotonic()
            try:
                ok = gb.check(torch, kernels[i], OP, m, n, k, seed=100 + si)
                rec["status"] = "checked" if ok else "failed"
                last = gb.RESULTS["checks"][-1]
                rec["rel_norm"] = last.get("rel_norm")
                rec["n_bad"] = last.get("n_bad")
            except Exception as exc:  # noqa: BLE001
                rec.update(status="error", reason=str(exc)[:300])
            rec["check_s"] = round(time.monotonic() - t1, 4)
            if rec["status"] == "checked":
                passing[str(i)] = kernels[i]
        gb.RESULTS["checks"].clear()  # kept per schedule above; the list would only grow
        if passing:
            t2 = time.monotonic()
            timed = gb.time_pair(torch, passing, OP, m, n, k, args.reps)
            wall = time.monotonic() - t2
            gb.RESULTS["timings"].clear()
            total = sum(r["median_us"] for r in timed["rows"].values()) or 1.0
            for lab, r in timed["rows"].items():
                share = round(wall * r["median_us"] / total, 4)
                if lab == "torch":
                    out["torch"].append(
                        {"dims": d, "chunk": unit, "median_us": r["median_us"], "time_s": share}
                    )
                    continue
                rec = rows[int(lab)]
                rec.update(
                    status="passed",
                    median_us=r["median_us"],
                    p20_us=r["p20_us"],
                    p80_us=r["p80_us"],
                    tflops=r["tflops"],
                    time_s=share,
                    sm_clock_mhz=timed["sm_clock_mhz"],
                )
        out["measurements"].extend(rows.values())
        out["compile"] = [compile_recs[i] for i in sorted(compile_recs)]
        done_units += 1
        save()
        best = min((r["median_us"] for r in rows.values() if r["median_us"]), default=None)
        print(
            f"chunk {unit + 1}/{len(work)} {m}x{n}x{k}: {len(passing)} of {len(ids)} passed"
            + (f", best {best:.1f} us" if best else "")
            + f" ({time.monotonic() - start:.0f} s)",
            flush=True,
        )
    out["complete"] = done_units == len(work)
    for f in futures.values():
        f.cancel()  # compiles not started yet (a run cut short): the process need not wait
    save()
    print_table(out)
    return 0


def print_table(out: dict) -> None:
    print()
    print(
        f"{'shape':18s} {'timed':>6s} {'failed':>6s} {'best us':>9s} {'median':>9s} "
        f"{'worst':>9s} {'torch':>9s}  best schedule"
    )
    for d in out["shapes"]:
        rs = [r for r in out["measurements"] if r["dims"] == d]
        ok = sorted((r for r in rs if r["median_us"]), key=lambda r: r["median_us"])
        bad = sum(1 for r in rs if r["status"] in ("failed", "error"))
        tor = [t["median_us"] for t in out["torch"] if t["dims"] == d]
        label = f"{d['M']}x{d['N']}x{d['K']}"
        if not ok:
            print(f"{label:18s} {0:6d} {bad:6d}")
            continue
        s = out["schedules"][ok[0]["id"]]
        name = (
            f"{s['tile_m']}x{s['tile_n']} c{s['consumers']} s{s['stages']} g{s['group_m']} "
            f"{'P' if s['persistent'] else 'np'}{' pp' if s['pingpong'] else ''}"
            f"{' cl2' if s['cluster_m'] == 2 else ''}{'' if s['fast_math'] else ' precise'}"
        )
        torch_med = sorted(tor)[len(tor) // 2] if tor else float("nan")
        print(
            f"{label:18s} {len(ok):6d} {bad:6d} {ok[0]['median_us']:9.1f} "
            f"{ok[len(ok) // 2]['median_us']:9.1f} {ok[-1]['median_us']:9.1f} "
            f"{torch_med:9.1f}  {name}"
        )
    print(f"complete: {out['complete']}  wall {out.get('wall_s')} s")


if __name__ == "__main__":
    sys.exit(main())
