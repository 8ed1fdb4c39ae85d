"""torch.compile's own kernels launched the way ours are: does its lead at a near tie come from
the kernel, from the compiler that built it, or from how it is run? (a GPU host, no Django)

    PYTHONPATH=. python3 -m lab.probes.probe_foreign --out DIR [--op rmsnorm] [--shape 1] \\
        [--impl torch_compile] [--plan lab/plans/suite-2026-12-03x.json] [--reps 60]

At one suite shape of one catalogue operator, in one process (bench.direct's Bench: one
stream, the L2 flushed before every run, interleaved rounds):

- compiles the GPU worker's torch.compile baseline (`--impl`, comma-separated for several) in a
  fresh inductor cache and finds the Triton kernels it built there (PTX, cubin, metadata);
- times, each verified first on the same inputs (every output element finite, sampled rows
  against the float64 reference, again after timing):
  - the baseline through its own launcher (`torch_compile`);
  - each Triton cubin, launched by cuda.core on Bench's stream (`cubin <kernel>`: their compiler's
    output, our launch);
  - each Triton PTX compiled by our nvJitLink (`ptx <kernel>`: their code, our compiler), as is,
    with every global load moved to the read-only path (`+nc`), and with the loads' L1/L2
    eviction hints taken out (`-hints`);
  - our plan's schedules at that shape (`ours:<tag>`), and the first three of them compiled by
    the ptxas that Triton ships (`ours:<tag> +tptxas`: our code, their compiler).

The grid of a Triton kernel is its rows over XBLOCK, a constant of the generated code that its
metadata does not carry: it is found by launching with XBLOCK = 64, 32, ..., 1 into poisoned
outputs and keeping the first that verifies (a larger XBLOCK leaves rows unwritten, and a grid
never exceeds the true one, so nothing is written out of bounds). Pointers go in the order of
the workload's inputs then outputs, 32-bit sizes as (rows, columns); Triton's trailing scratch
pointers get 0 (none of these kernels asks for scratch). A wrong mapping fails verification.

Then phase 2 (same_places): each baseline again beside the fastest of those cubins and our two
fastest schedules, each also writing into the very buffers the baseline wrote in the same round,
so that kernels are compared at the same output placements.

Writes DIR/foreign.json (every record, the samples, the environment) and prints a table,
fastest first. Nothing of Triton's is kept in the repository: its files live in a temporary
cache for the run.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

PLAN = "lab/plans/suite-2026-12-03x.json"
XBLOCKS = (64, 32, 16, 8, 4, 2, 1)
_PARAM = re.compile(r"^\s*\.param\s+\.(u64|u32|b64|b32|s32)\b")


def entry_params(ptx: str) -> list[str]:
    """The kinds of the first entry's parameters, in order: "ptr" (64-bit) or "u32"."""
    head = ptx[ptx.index(".entry") :]
    head = head[: head.index(")")]
    kinds = []
    for line in head.splitlines():
        m = _PARAM.match(line)
        if m:
            kinds.append("ptr" if m.group(1) in ("u64", "b64") else "u32")
    return kinds


def to_read_only(ptx: str) -> str:
    """Every coherent global load moved to the read-only path (ld.global.nc)."""
    return re.sub(r"\bld\.global\.(?!nc\b)", "ld.global.nc.", ptx)


def without_load_hints(ptx: str) -> str:
    """Global loads without L1 eviction qualifiers and without the L2 cache-policy operand."""
    out = []
    for line in ptx.splitlines():
        if "ld.global" in line:
            line = re.sub(r"\.L1::evict_(?:last|first|normal|unchanged)", "", line)
            if ".L2::cache_hint" in line:
                line = line.replace(".L2::cache_hint", "")
                line = re.sub(r"\],\s*%rd\d+\s*;", "];", line)
        out.append(line)
    return "\n".join(out) + "\n"


def foreign_args(kinds: list[str], ptrs: list[int], sizes: list[int]) -> list:
    """Arguments for a Triton entry: pointers in order, then 0 for its scratch pointers; its
    32-bit parameters from `sizes` in order."""
    args, p, u = [], 0, 0
    for k in kinds:
        if k == "ptr":
            args.append(ptrs[p] if p < len(ptrs) else 0)
            p += 1
        else:
            if u >= len(sizes):
                raise ValueError(f"the kernel takes more 32-bit parameters than {sizes}")
            args.append(np.uint32(sizes[u]))
            u += 1
    if p < len(ptrs):
        raise ValueError(f"the kernel takes {p} pointers, the workload has {len(ptrs)}")
    return args


def triton_kernels(cache: str) -> list[dict]:
    """Every kernel inductor had Triton build under `cache` (named "triton_..."): name, PTX,
    cubin, warps, shared bytes. Other Triton kernels there (the plain Triton baselines) take
    other arguments than inductor's (pointers, then rows and columns) and are left out."""
    found = []
    for meta_path in sorted(glob.glob(f"{cache}/**/*.json", recursive=True)):
        stem = meta_path[: -len(".json")]
        if not (os.path.exists(stem + ".ptx") and os.path.exists(stem + ".cubin")):
            continue
        with open(meta_path) as f:
            meta = json.load(f)
        if "num_warps" not in meta or not str(meta.get("name", "")).startswith("triton_"):
            continue
        with open(stem + ".ptx") as f:
            ptx = f.read()
        with open(stem + ".cubin", "rb") as f:
            cubin = f.read()
        found.append(
            {
                "name": meta["name"],
                "hash": os.path.basename(os.path.dirname(meta_path))[:8],
                "warps": int(meta["num_warps"]),
                "shared": int(meta.get("shared", 0)),
                "ptx": ptx,
                "cubin": cubin,
            }
        )
    return found


def triton_ptxas() -> str | None:
    try:
        import triton

        path = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
    except ImportError:
        return None
    return path if os.path.exists(path) else None


def ptxas_cubin(ptxas: str, ptx: str, arch: str) -> tuple[bytes | None, str]:
    """(cubin, note) from another ptxas. One older than our PTX's ISA version is tried again
    with the version lowered to 8.7, then 8.0 (the note says so); (None, its log) if none
    compiles."""
    log = ""
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        for version in (None, "8.7", "8.0"):
            text = (
                ptx
                if version is None
                else re.sub(r"\.version \d+\.\d+", f".version {version}", ptx)
            )
            with open(src, "w") as f:
                f.write(text)
            r = subprocess.run(
                [ptxas, f"-arch={arch}", "-O3", src, "-o", dst], capture_output=True, text=True
            )
            if r.returncode == 0:
                with open(dst, "rb") as f:
                    return f.read(), "" if version is None else f"PTX ISA lowered to {version}"
            log = (r.stderr or r.stdout)[-300:]
    return None, log


def ptx_arch(ptx: str) -> str:
    m = re.search(r"^\s*\.target\s+(sm_\w+)", ptx, re.M)
    return m.group(1) if m else "sm_90"


def at_outputs_of(box: dict, make, dims: dict):
    """A launcher that writes wherever the baseline's last call put its outputs (box["out"]):
    run right after the baseline in each round, it writes the very buffers the baseline just
    wrote, so both see the same placements. One launcher per placement, made on first sight
    (warm them all up before timing: torch's allocator alternates between a few buffers)."""
    made = {}

    def run():
        outs = box["out"]
        key = tuple(t.data_ptr() for t in outs.values())
        if key not in made:
            made[key] = make(outs, dims)
        made[key]()

    run.made = made
    return run


def same_places(bench, w, ir, dims, inputs, outputs, entrants, makers, nbytes, reps) -> dict:
    """Phase 2: each baseline (torch's or plain Triton's) beside the fastest Triton cubin and our
    two fastest schedules of phase 1, each both at our output buffers and at the baseline's own
    (see at_outputs_of), timed in one set of rounds. Where the kernels at the baseline's buffers
    match the baseline and differ from themselves at ours, the placement, not the kernel or the
    launch, made the difference. Every entrant at the baseline's buffers is verified into
    poisoned outputs before and after timing."""
    from bench.direct import check_rows, judge

    torch = bench.torch
    timed = {k: e for k, e in entrants.items() if "median_us" in e[1]}
    baselines = [k for k, e in timed.items() if e[1]["impl"] not in ("ours", "foreign")]
    fastest = sorted(timed, key=lambda k: timed[k][1]["median_us"])
    picks = [k for k in fastest if k.startswith("cubin")][:1]
    picks += [k for k in fastest if k.startswith("ours:") and "+tptxas" not in k][:2]
    out = {"baselines": {}, "records": []}
    for base in baselines:
        run_base, base_rec, box = entrants[base]

        def poisoned_check(run_base, at, box=box):
            """The baseline once, its outputs poisoned, then `at` writes them: checked."""
            run_base()
            for t in box["out"].values():
                t.fill_(float("nan"))
            at()
            torch.cuda.synchronize()
            return check_rows(bench, w, ir, inputs, box["out"], dims)

        phase = {base: (run_base, {"impl": base_rec["impl"], "tag": base}, box)}
        for k in picks:
            run, rec, sink = entrants[k]
            phase[k] = (run, {"impl": rec["impl"], "tag": k}, sink)
            at = at_outputs_of(box, makers[k], dims)
            for _ in range(8):  # every buffer the baseline cycles through, made before timing
                run_base()
                at()
            torch.cuda.synchronize()
            key = f"{k} @{base}"
            # both of the baseline's last two buffers
            verdicts = [poisoned_check(run_base, at) for _ in range(2)]
            rec = {"impl": "foreign" if k.startswith("cubin") else "ours", "tag": key}
            if not all(v["passed"] for v in verdicts):
                out["records"].append(rec | {"status": "failed", "reason": verdicts[-1]["reason"]})
                continue
            # judge checks it where a baseline's outputs are (box), without poisoning them
            # first: the poisoned checks are the ones here, before and after timing
            phase[key] = (at, rec | {"impl": "placed"}, box)
        judge(bench, w, ir, dims, inputs, outputs, phase, nbytes, reps)
        for at, rec, _sink in phase.values():
            if rec["impl"] != "placed":
                continue
            again = poisoned_check(run_base, at)
            if not again["passed"]:
                rec |= {"status": "failed", "reason": "after timing: " + again["reason"]}
            rec["placements"] = len(at.made)
        x0 = next(iter(inputs.values())).data_ptr()
        out["baselines"][base] = {
            "our_output_offsets": [t.data_ptr() - x0 for t in outputs.values()],
            "records": [rec for _r, rec, _s in phase.values()],
        }
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--op", default="rmsnorm")
    p.add_argument("--shape", type=int, default=1, help="index into the operator's suite shapes")
    p.add_argument(
        "--dims",
        metavar="MxN",
        help="a shape of one's own instead (ours: the plan's schedules there, else the "
        "suite's screened candidates)",
    )
    p.add_argument("--impl", default="torch_compile")
    p.add_argument("--plan", default=PLAN)
    p.add_argument("--reps", type=int, default=60)
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    cache = tempfile.mkdtemp(prefix="inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    os.environ["TRITON_CACHE_DIR"] = os.path.join(cache, "triton")
    os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "0"

    from cuda.core import ObjectCode, launch

    from bench.direct import (
        Bench,
        check_rows,
        compiled_schedule,
        environment,
        judge,
        make_inputs,
        make_outputs,
        our_launcher,
    )
    from bench.suite import _catalogue
    from factory.compile import compile_ptx
    from factory.families.row.schedules import Schedule
    from gpuworker.baselines import make_torch_baseline
    from gpuworker.gpu import launch_config

    bench = Bench()
    torch = bench.torch
    w, _, ir = _catalogue()[a.op]
    dims = dict(w.shapes[a.shape])
    if a.dims:
        mm, nn = (int(x) for x in a.dims.lower().split("x"))
        dims = {ir.row_dim: nn, **{d: mm for d in ir.batch_dims}}
    m, n = int(dims[ir.batch_dims[0]]), int(dims[ir.row_dim])
    inputs = make_inputs(bench, w, dims, seed=1234)
    outputs = make_outputs(bench, w, dims)
    nbytes = sum(t.numel() * t.element_size() for t in (inputs | outputs).values())
    entrants, records = {}, []
    makers = {}  # tag -> make(outputs, dims): the same kernel writing into other outputs

    def in_order(outs: dict) -> dict:
        """The inputs, then the given outputs, in the workload's order (as `ptrs` below)."""
        return inputs | {o.name: outs[o.name] for o in w.outputs}

    def add(key, run, rec, sink=None):
        records.append(rec)
        entrants[key] = (run, rec, sink)

    for impl in a.impl.split(","):
        fn, version, config = make_torch_baseline(impl, w)
        box = {}

        def run_baseline(fn=fn, box=box):
            box["out"] = fn(inputs)

        run_baseline()
        run_baseline()
        torch.cuda.synchronize()
        add(impl, run_baseline, {"impl": impl, "tag": impl, "version": version}, box)

    ptrs = [t.data_ptr() for t in (inputs | outputs).values()]
    xnumel = [m, n]

    def foreign(label, kernel_obj, k, extra):
        """Find the kernel's XBLOCK by verification; add it as an entrant if one verifies."""
        kinds = entry_params(k["ptx"])
        args = foreign_args(kinds, ptrs, xnumel)
        block = (32 * k["warps"], 1, 1)
        rec = {"impl": "foreign", "tag": label, "kernel": k["name"], "hash": k["hash"]} | extra
        rec |= {"warps": k["warps"], "shared": k["shared"]}
        for xb in XBLOCKS:
            cfg = launch_config(((m + xb - 1) // xb, 1, 1), block, k["shared"])
            for t in outputs.values():
                t.fill_(float("nan"))
            launch(bench.stream, cfg, kernel_obj, *args)
            torch.cuda.synchronize()
            if check_rows(bench, w, ir, inputs, outputs, dims)["passed"]:

                def run(cfg=cfg):
                    launch(bench.stream, cfg, kernel_obj, *args)

                def make(outs, _dims, cfg=cfg):
                    ptrs_at = [t.data_ptr() for t in in_order(outs).values()]
                    args_at = foreign_args(kinds, ptrs_at, xnumel)
                    return lambda: launch(bench.stream, cfg, kernel_obj, *args_at)

                add(label, run, rec | {"xblock": xb})
                makers[label] = make
                return
        records.append(rec | {"status": "failed", "reason": "no XBLOCK verified"})

    kernels = triton_kernels(os.environ["TRITON_CACHE_DIR"])
    print(f"{len(kernels)} Triton kernels built", flush=True)
    for i, k in enumerate(kernels):
        name = f"{i}.w{k['warps']}"
        foreign(f"cubin {name}", ObjectCode.from_cubin(k["cubin"]).get_kernel(k["name"]), k, {})
        arch = ptx_arch(k["ptx"])
        for suffix, text in (
            ("", k["ptx"]),
            (" +nc", to_read_only(k["ptx"])),
            (" -hints", without_load_hints(k["ptx"])),
        ):
            rep = compile_ptx(text, arch=arch)
            if not rep.ok:
                rec = {"impl": "foreign", "tag": f"ptx {name}{suffix}", "status": "rejected"}
                records.append(rec | {"reason": rep.log[-300:]})
                continue
            kobj = ObjectCode.from_cubin(rep.cubin).get_kernel(k["name"])
            foreign(f"ptx {name}{suffix}", kobj, k, {"registers": rep.registers})

    with open(a.plan) as f:
        planned = [Schedule.from_dict(d) for d in json.load(f)[a.op].get(f"{m}x{n}", [])]
    if not planned:
        from bench.suite import candidate_schedules

        planned = candidate_schedules(ir, dims)
    ptxas = triton_ptxas()
    for j, s in enumerate(planned):
        em, rep, why = compiled_schedule(ir, s)
        rec = {"impl": "ours", "tag": f"ours:{s.tag()}", "registers": rep.registers}
        if why:
            records.append(rec | {"status": "rejected", "reason": why})
            continue
        add(rec["tag"], our_launcher(bench, em, rep.cubin, inputs | outputs, dims), rec)
        makers[rec["tag"]] = lambda outs, d, em=em, cubin=rep.cubin: our_launcher(
            bench, em, cubin, in_order(outs), d
        )
        if ptxas and j < 3:
            cubin, note = ptxas_cubin(ptxas, em.ptx, "sm_90")
            tag = f"ours:{s.tag()} +tptxas"
            if cubin is None:
                records.append(rec | {"tag": tag, "status": "rejected", "reason": note})
                continue
            run = our_launcher(bench, em, cubin, inputs | outputs, dims)
            add(tag, run, rec | {"tag": tag, "note": note})

    judge(bench, w, ir, dims, inputs, outputs, entrants, nbytes, a.reps)
    swapped = same_places(bench, w, ir, dims, inputs, outputs, entrants, makers, nbytes, a.reps)
    env = environment()
    if ptxas:
        env["triton_ptxas"] = (
            subprocess.run([ptxas, "--version"], capture_output=True, text=True)
            .stdout.strip()
            .splitlines()[-1]
        )
    ceiling = bench.copy_ceiling_tbps()
    with open(os.path.join(a.out, "foreign.json"), "w") as f:
        json.dump(
            {
                "op": a.op,
                "dims": dims,
                "bytes": nbytes,
                "copy_tbps": ceiling,
                "env": env,
                "records": records,
                "same_places": swapped,
            },
            f,
            indent=1,
        )
    shutil.rmtree(cache, ignore_errors=True)
    timed = sorted((r for r in records if "median_us" in r), key=lambda r: r["median_us"])
    print(f"{a.op} {m}x{n} bf16, copy ceiling {ceiling:.3f} TB/s, {a.reps} rounds")
    print("| entrant | median us | p20-p80 | TB/s | registers |")
    print("|---|---|---|---|---|")
    for r in timed:
        print(
            f"| {r['tag']} | {r['median_us']:.2f} | {r['p20_us']:.2f}-{r['p80_us']:.2f} | "
            f"{r['tbps']:.3f} | {r.get('registers', '')} |"
        )
    for base, b in swapped["baselines"].items():
        print(f"same placements as {base} (ours at {b['our_output_offsets']} bytes from x):")
        for r in b["records"]:
            if "median_us" in r:
                print(
                    f"| {r['tag']} | {r['median_us']:.2f} | {r['p20_us']:.2f}-{r['p80_us']:.2f} "
                    f"| {r.get('placements', '')} |"
                )
            else:
                print(f"| {r['tag']} | {r.get('status')} {r.get('reason', '')[:120]} |")
    for r in swapped["records"]:
        print(f"not placed: {r['tag']}: {r.get('reason', '')[:200]}")
    for r in records:
        if "median_us" not in r:
            print(f"not timed: {r['tag']}: {r.get('status')} {r.get('reason', '')[:200]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
