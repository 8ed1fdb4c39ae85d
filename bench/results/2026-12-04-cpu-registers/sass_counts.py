"""One-off, CPU only: for LayerNorm's one-pass mean and variance ("w" layouts), the SASS that
ptxas makes of each layout: registers, spill bytes, and an estimate of the instructions a
thread issues for one row on each path. For the estimate the kernel's PTX is pinned to one
path (whole rows; a tail of whole vectors; a tail element by element) by turning the path's
branches into jumps or deleting them, so ptxas drops the code no row takes; what is left in
the kernel's own function (not the subroutine of rcp.rn's rare slow path) is counted. It
overcounts by the setup of those rare calls (a few instructions a call site) and counts the
row loop once. Run once per emitter (PYTHONPATH picks the checkout); needs nvdisasm
(NVDISASM=path).

    PYTHONPATH=CHECKOUT NVDISASM=.../nvdisasm python3 sass_counts.py OUT.json
"""
import json
import os
import re
import subprocess
import sys
import tempfile

from factory.compile import compile_ptx
from factory.emit import emit
from factory.ir import lower
from factory.schedules import space
from factory.spec import load_catalogue

CASES = [(16384, 5000), (16384, 4999), (16384, 5120), (16384, 4096), (16384, 8192)]
INSTR = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
TAIL_BRA = re.compile(r"^\s*@!?%p\d+ bra (\$L_(?:load_tail|p\d+_tail|row_tail)_\d+);$", re.M)
ELEMS_BRA = re.compile(r"^\s*@!?%p\d+ bra (\$L_(?:tail|row)_elems_\d+);$", re.M)
LONG_BRA = re.compile(r"^\s*@!?%p\d+ bra \$L_long_row_\d+;$", re.M)


def layouts(ir, dims):
    """The register-held layouts of 128 threads a row and the fewest chunks (the fastest at
    these widths in bench/results/2026-12-04-h200-odd) with one-pass moments, uncapped or
    capped for 768 threads an SM, one row a block, 16-byte accesses, the default hints."""
    for s in space(ir, [dims]):
        if (
            s.mode == "cached"
            and s.moments
            and s.threads_per_row == 128
            and s.rows_per_block == 1
            and s.vec_elems == 8
            and s.load_hint == "nc"
            and s.store_hint == "none"
            and s.col_hint == "nc"
            and s.col_groups == 1
            and not s.prefetch_rows
            and not s.persistent_blocks_per_sm
            and s.cluster_blocks == 1
            and s.acc_split == 1
            and not s.early_cols
            and s.fast_math
            and s.min_threads_per_sm in (0, 768)
            and s.chunks == -(-dims[ir.row_dim] // 1024)
        ):
            yield s


def pinned(ptx: str, path: str) -> str:
    """`ptx` with every row taking `path`: "fast", "vectors" or "elements"."""
    ptx = LONG_BRA.sub("", ptx)
    if path == "fast":
        return TAIL_BRA.sub("", ptx)
    ptx = TAIL_BRA.sub(lambda m: f"    bra.uni {m.group(1)};", ptx)
    if path == "vectors":
        return ELEMS_BRA.sub("", ptx)
    return ELEMS_BRA.sub(lambda m: f"    bra.uni {m.group(1)};", ptx)


def sass_of(cubin: bytes, entry: str) -> list[str]:
    """The opcodes of `entry`'s own function (its .text section)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run(
            [os.environ["NVDISASM"], "-c", f.name], capture_output=True, text=True, check=True
        ).stdout
    own = out.split(f".text.{entry}:", 1)[1].split(".section", 1)[0]
    return [m.group(2) for m in INSTR.finditer(own)]


def main(out):
    ir = lower(load_catalogue()["layernorm"])
    rows = []
    for m, n in CASES:
        dims = {ir.row_dim: n, **{d: m for d in ir.batch_dims}}
        for s in layouts(ir, dims):
            em = emit(ir, s)
            rep = compile_ptx(em.ptx)
            row = {
                "shape": f"{m}x{n}",
                "tag": s.tag(),
                "registers": rep.registers,
                "spill_store_bytes": rep.spill_store_bytes,
                "sass_whole_kernel": len(sass_of(rep.cubin, em.entry)),
            }
            paths = ["fast"] + (["vectors", "elements"] if s.tail == "vectors" else ["elements"])
            for path in paths:
                ops = sass_of(compile_ptx(pinned(em.ptx, path)).cubin, em.entry)
                row[f"path_{path}"] = len(ops)
                row[f"path_{path}_mufu_rcp"] = ops.count("MUFU.RCP")
            rows.append(row)
            print(row, flush=True)
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
