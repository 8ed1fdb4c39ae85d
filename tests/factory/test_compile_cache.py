"""The compile cache: a PTX text compiled before is read back from disk (same arch, options and
nvJitLink), whole and marked as such; a torn file is compiled again; pruning keeps it bounded."""

import os
from pathlib import Path

import pytest

from factory import compile as C

PTX = (Path(__file__).resolve().parents[1] / "fixtures" / "ptx" / "scale_by_two.ptx").read_text()


@pytest.fixture
def cache(tmp_path):
    before = C.cache_dir()
    C.configure_cache(tmp_path / "cache")
    yield tmp_path / "cache"
    C.configure_cache(before)


def _files(root: Path) -> list[Path]:
    return sorted(root.glob("??/*.json"))


def test_a_second_compile_of_the_same_ptx_is_read_back_whole(cache):
    first = C.compile_ptx(PTX)
    again = C.compile_ptx(PTX)
    assert first.ok and not first.cached
    assert again.cached and again.cubin == first.cubin and again.cubin
    assert again.to_dict() == {**first.to_dict(), "cached": True}
    assert len(_files(cache)) == 1


def test_arch_and_options_are_part_of_the_key(cache):
    C.compile_ptx(PTX)
    capped = C.compile_ptx(PTX, options=("-Xptxas=-maxrregcount=16",))
    other = C.compile_ptx(PTX, arch="sm_100")
    assert not capped.cached and not other.cached
    assert len(_files(cache)) == 3
    assert C.compile_ptx(PTX, arch="sm_100").cached


def test_a_refused_ptx_is_kept_with_its_log(cache):
    bad = PTX.replace("ret;", "bogus.op %r1;", 1)
    first = C.compile_ptx(bad)
    again = C.compile_ptx(bad)
    assert not first.ok and first.log and first.cubin is None
    assert again.cached and not again.ok and again.log == first.log and again.cubin is None


def test_a_torn_file_is_compiled_again_and_rewritten(cache):
    C.compile_ptx(PTX)
    (path,) = _files(cache)
    path.write_text('{"ok": tru')
    report = C.compile_ptx(PTX)
    assert report.ok and not report.cached and report.cubin
    assert C.compile_ptx(PTX).cached


def test_with_the_cache_off_nothing_is_kept(tmp_path):
    before = C.cache_dir()
    C.configure_cache(None)
    try:
        assert not C.compile_ptx(PTX).cached and not C.compile_ptx(PTX).cached
    finally:
        C.configure_cache(before)


def test_pruning_removes_the_oldest_beyond_four_fifths(cache):
    for i in range(6):
        C.compile_ptx(PTX + f"\n// variant {i}\n")
    files = _files(cache)
    assert len(files) == 6
    for age, f in enumerate(files):  # the first file is the oldest
        os.utime(f, (1_000_000 + age, 1_000_000 + age))
    assert C.prune_cache(cache, max_entries=10) == 0
    assert C.prune_cache(cache, max_entries=5) == 2  # down to 4, the newest
    assert _files(cache) == files[2:]


def test_the_gpu_worker_and_the_artifact_compile_afresh(cache):
    """What is timed on the GPU and what a customer downloads come from the PTX, never from a
    file on this host's disk."""
    from gpuworker.runner import _compile
    from portal.artifacts import _default_compile

    C.compile_ptx(PTX)  # in the cache now
    report, cubin, error = _compile(PTX, "sm_90")
    assert not error and cubin and report["cached"] is False
    assert _default_compile(PTX, "sm_90").cached is False
    assert C.compile_ptx(PTX).cached and len(_files(cache)) == 1
