"""The largest layouts of each new family's space (most threads, widest loads, most rows in
flight) and the smallest compile with nvJitLink for sm_90 without spills or a stack frame: the
space holds only layouts that fit a block's registers and 48 KiB of static shared memory."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest

from factory import families
from factory.spec import load_manifest

ROOT = Path(__file__).parents[2]
FAMS = (
    "colreduce",
    "segreduce",
    "allreduce",
    "scan",
    "argreduce",
    "pool",
    "segnorm",
    "rowsplit",
    "flat",
)
EXAMPLES = sorted(p for f in FAMS for p in glob.glob(str(ROOT / f"factory/examples/{f}_*.toml")))


def _size(s) -> int:
    return (
        s.threads
        * getattr(s, "vec", 1)
        * max(1, getattr(s, "unroll", 1))
        * getattr(s, "chunks", 1)
        * getattr(s, "split", 1)
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: Path(p).stem)
def test_the_extremes_of_the_space_compile_clean(path):
    from factory.compile import compile_ptx

    w = load_manifest(Path(path).read_text())
    fam, ir = families.family_for(w)
    space = sorted(fam.space(ir, None), key=_size)
    for s in space[:3] + space[-8:]:
        r = compile_ptx(fam.emit(ir, s).ptx, "sm_90")
        assert r.ok, (s, r.log[:500])
        assert not r.spill_store_bytes and not r.stack_bytes, (s, r.spill_store_bytes)
