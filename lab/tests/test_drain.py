"""lab.probes.drain's arithmetic (the GPU part runs on the device): the drained time is the run
plus its second flush, less the flush timed alone in the same rounds."""

import pytest

from lab.probes.drain import drained_rows, table


def _case(records, dims=None, nbytes=402_653_184):
    return {"dims": dims or {"M": 16384, "N": 4096}, "bytes": nbytes, "records": records}


def _rec(tag, us, impl=None, status="passed"):
    return {"tag": tag, "impl": impl or tag, "status": status, "median_us": us}


def test_the_drained_time_subtracts_the_flush_timed_alone():
    plain = _case(
        [
            _rec("ct128r1v8c4_elno", 90.6, impl="ours"),
            _rec("torch_compile", 92.4),
            _rec("copy", 94.0),
            _rec("flush", 2.1),
        ]
    )
    drained = _case(
        [
            _rec("ct128r1v8c4_elno", 90.6 + 70.0 + 6.0, impl="ours"),
            _rec("torch_compile", 92.4 + 70.0 + 5.0),
            _rec("copy", 94.0 + 70.0 + 6.5),
            _rec("flush", 70.0),
        ]
    )
    rows = drained_rows("silu_mul", plain, drained)
    assert [r["entrant"] for r in rows] == ["ours: ct128r1v8c4_elno", "torch_compile", "copy"]
    ours = rows[0]
    assert ours["shape"] == "16384x4096" and ours["flush_us"] == 70.0
    assert ours["drained_us"] == pytest.approx(96.6)
    assert ours["extra_us"] == pytest.approx(6.0)
    assert ours["plain_tbps"] == pytest.approx(402_653_184 / 90.6e-6 / 1e12)
    assert ours["drained_tbps"] == pytest.approx(402_653_184 / 96.6e-6 / 1e12)
    lines = table(rows, {"plain": 4.28, "drained": 4.20})
    assert lines[0] == "Copy ceiling (2 GiB): plain 4.280 TB/s, drained 4.200."
    assert lines[4].startswith(
        "| silu_mul | 16384x4096 | ours: ct128r1v8c4_elno | 90.6 | 96.6 | +6.0 |"
    )


def test_an_entrant_that_failed_either_way_has_no_row_and_no_flush_is_an_error():
    plain = _case([_rec("a", 10.0, impl="ours"), _rec("b", 11.0), _rec("flush", 1.0)])
    drained = _case(
        [_rec("a", 0, impl="ours", status="failed"), _rec("b", 80.0), _rec("flush", 69.0)]
    )
    assert [r["entrant"] for r in drained_rows("relu2", plain, drained)] == ["b"]
    with pytest.raises(ValueError, match="flush"):
        drained_rows("relu2", plain, _case([_rec("b", 80.0)]))
