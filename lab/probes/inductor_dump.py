"""What torch.compile max-autotune runs for a catalogue operator: its generated Triton code and
the configs its autotuner timed, for comparing with our kernels (a GPU host, no Django).

    PYTHONPATH=. python3 -m lab.probes.inductor_dump --out DIR [--ops rmsnorm,add_rmsnorm] \
        [--shape 0] [--impl torch_compile] [--dims M=16384,N=4999]

Compiles the GPU worker's own max-autotune baseline (or, with --impl, plain torch.compile) of
each operator (gpuworker.baselines) at a suite shape, runs it a few times, and leaves under
DIR: `inductor_<op>.log` (inductor's output code and the autotuner's per-config timings, from
torch's logging), the generated source files (`code_<op>_<n>.py`) copied out of inductor's
cache, and the PTX Triton built for every config it tried
(`ptx_<op>_<kernel>_w<warps>_<n>.ptx`, with its launch metadata as `.json`).
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import shutil
import sys
import tempfile


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--ops", default="rmsnorm,add_rmsnorm,layernorm")
    p.add_argument("--shape", type=int, default=0, help="index into the operator's suite shapes")
    p.add_argument("--dims", default="", help="other dims instead, e.g. M=16384,N=4999")
    p.add_argument(
        "--impl",
        default="torch_compile_max_autotune",
        choices=("torch_compile", "torch_compile_max_autotune"),
        help="which of the worker's torch.compile baselines to compile",
    )
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    cache = tempfile.mkdtemp(prefix="inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    os.environ["TRITON_CACHE_DIR"] = os.path.join(cache, "triton")
    os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "0"  # compile afresh: the autotuner runs
    os.environ["TORCH_LOGS"] = "output_code,+torch._inductor.runtime.triton_heuristics"
    import numpy as np
    import torch

    from bench.suite import _catalogue
    from factory.spec import random_inputs
    from gpuworker.baselines import make_torch_baseline

    catalogue = _catalogue()
    for op in a.ops.split(","):
        w = catalogue[op][0]
        dims = dict(w.shapes[min(a.shape, len(w.shapes) - 1)])
        if a.dims:
            dims = {k: int(v) for k, v in (kv.split("=") for kv in a.dims.split(","))}
        log_path = os.path.join(a.out, f"inductor_{op}.log")
        handler = logging.FileHandler(log_path, mode="w")
        handler.setLevel(logging.DEBUG)
        logging.getLogger("torch").addHandler(handler)
        try:
            torch._dynamo.reset()
            fn, version, config = make_torch_baseline(a.impl, w)
            host = random_inputs(w, dims, 0)
            dev = {}
            for t in w.inputs:
                arr = np.asarray(host[t.name])
                if t.dtype == "bf16":
                    dev[t.name] = torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16).cuda()
                else:
                    dev[t.name] = torch.from_numpy(arr).cuda()
            for _ in range(3):
                fn(dev)
            torch.cuda.synchronize()
            print(f"{op} {dims}: compiled ({version}, {config})", flush=True)
        except Exception as e:  # noqa: BLE001 - a diagnostic: say what failed and go on
            print(f"{op}: failed: {type(e).__name__}: {e}", flush=True)
        finally:
            logging.getLogger("torch").removeHandler(handler)
            handler.close()
        for n, path in enumerate(sorted(glob.glob(f"{cache}/**/*.py", recursive=True))):
            if "triton_" in open(path, errors="replace").read():
                shutil.copy(path, os.path.join(a.out, f"code_{op}_{n}.py"))
        for n, path in enumerate(sorted(glob.glob(f"{cache}/**/*.ptx", recursive=True))):
            meta_path = path[: -len(".ptx")] + ".json"
            warps = "?"
            if os.path.exists(meta_path):
                with open(meta_path) as f:
                    warps = json.load(f).get("num_warps", "?")
            stem = f"ptx_{op}_{os.path.basename(path)[:-4]}_w{warps}_{n}"
            shutil.copy(path, os.path.join(a.out, stem + ".ptx"))
            if os.path.exists(meta_path):
                shutil.copy(meta_path, os.path.join(a.out, stem + ".json"))
        shutil.rmtree(cache, ignore_errors=True)
        os.makedirs(cache, exist_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
