"""Found by the walk (test_web_walk.py): a results file may leave out a timing's interval and
throughput and a verification's errors (the schema has them optional, and the database stores
None), and approving such a kernel then failed with a 500 while the artifact's REPORT.md was
written. The report now prints a dash for a number the results did not give."""

import io
import zipfile

from portal.artifacts import build_artifact
from tests.portal.web.test_web_artifacts_builder import _inputs


def test_the_report_is_written_when_optional_numbers_are_missing():
    sparse_timing = {
        "dims": {"N": 4096},
        "median_us": 2.0,
        "p20_us": None,
        "p80_us": None,
        "ci_low_us": None,
        "ci_high_us": None,
        "samples_us": [],
        "bytes": None,
        "tbps": None,
        "sm_clock_mhz": None,
    }
    sparse_check = {
        "dims": {"N": 4095},
        "heldout": True,
        "passed": False,
        "rel_err": None,
        "max_abs_err": None,
        "reason": "crashed",
    }
    built = build_artifact(
        _inputs(timing=[sparse_timing], verification=[sparse_check], baselines=[]),
        created_at="2026-12-07T10:00:00Z",
    )
    with zipfile.ZipFile(io.BytesIO(built.data)) as z:
        report = z.read("report/REPORT.md").decode()
    assert "| N=4096 | 2.000 | –\u2013– | – | 0 |" in report
    assert "| NO | – | – |" in report
