"""lab.probes.bulkrows: row kernels fed by the bulk-copy engine, timed by bench.direct beside ours.
The kernels compile here; their correctness and timing are for the GPU (gpu_pending.sh bulk)."""

from __future__ import annotations

import re

import pytest

from factory.compile import compile_ptx
from lab.probes import bulkrows
from lab.probes._ptx import KERNELS, ptx_path


def _ptx() -> str:
    import shutil

    if shutil.which("nvcc") is None and not (KERNELS / "bulkrows.ptx").exists():
        pytest.skip("lab/kernels/bulkrows.ptx is not built and there is no nvcc here")
    return ptx_path("bulkrows").read_text()


def _entries() -> list[str]:
    return re.findall(r"\.visible \.entry (\w+)\(", _ptx())


def test_every_entry_links_for_sm_90_without_spills_and_parses_back():
    entries = _entries()
    assert len(entries) == 30
    rep = compile_ptx(_ptx(), "sm_90")
    assert rep.ok, rep.log
    for entry in entries:
        line = rep.log.split(f"Function properties for '{entry}'")[1].splitlines()[1]
        assert "0 stack" in line and "0 bytes lmem" in line, entry
        spec = bulkrows.parse("bulk:" + entry.removeprefix("bulk_") + "@2")
        assert spec["entry"] == entry


def test_rows_are_loaded_by_the_bulk_copy_engine_and_the_stores_follow_the_name():
    ptx = _ptx()
    parts = re.split(r"\.visible \.entry (\w+)\(", ptx)[1:]
    bodies = dict(zip(parts[0::2], parts[1::2]))
    assert len(bodies) == 30
    for entry, body in bodies.items():
        if entry.startswith("bulk_regrms_"):  # the control: rows straight into registers
            assert "cp.async.bulk" not in body and "mbarrier" not in body, entry
            assert "st.global.v4" in body, entry
            assert ("createpolicy.fractional.L2::evict_last" in body) == entry.endswith("e")
            continue
        assert "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes" in body
        assert "mbarrier.try_wait.parity" in body
        bulk_store = "cp.async.bulk.global.shared::cta.bulk_group" in body
        assert bulk_store == entry.endswith("b"), entry
        assert ("st.global.v4" in body) == entry.endswith("r"), entry


def test_parse_and_launch_shape():
    spec = bulkrows.parse("bulk:rms_t256k4s3r@4")
    assert spec == {
        "op": "rms",
        "entry": "bulk_rms_t256k4s3r",
        "threads": 256,
        "vectors": 4,
        "stages": 3,
        "bulk_store": False,
        "blocks_per_sm": 4,
    }
    # One persistent wave of 4 blocks per SM, three 16 KB stages of shared memory each.
    assert bulkrows.launch_shape(spec, 16384, 8192, 132) == (528, 3 * 16384)
    assert bulkrows.launch_shape(spec, 7, 8192, 132) == (7, 3 * 16384)  # never more than M
    with pytest.raises(bulkrows.NotThisShape, match="rows of 8192, not 4096"):
        bulkrows.launch_shape(spec, 16384, 4096, 132)
    # The register-row control: no shared-memory stages, its row count and L2 hint in the name.
    reg = bulkrows.parse("bulk:regrms_t256k4s1e@3")
    assert (reg["entry"], reg["stages"], reg["bulk_store"]) == ("bulk_regrms_t256k4s1e", 1, False)
    assert bulkrows.launch_shape(reg, 16384, 8192, 132) == (396, 0)
    bad_names = ("bulk:rms_t256k4s3@4", "bulk:gelu_t256k4s3r@4", "rms_t256k4s3r@4")
    for bad in bad_names + ("bulk:regrms_t256k4s3e@3", "bulk:regrms_t256k4s1r@3"):
        with pytest.raises(ValueError, match="not a bulk-row kernel name"):
            bulkrows.parse(bad)
