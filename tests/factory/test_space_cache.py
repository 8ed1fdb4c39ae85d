"""A schedule space read back from disk by another worker process is the one it would build."""

import dataclasses
import os
import subprocess
import sys

from factory.compile import cache_dir, configure_cache
from factory.families.row import schedules as S
from factory.families.row.ir import lower
from factory.spec import load_catalogue

DIMS = {"M": 64, "N": 4999}


def _ir():
    w = load_catalogue()["rmsnorm"]
    return lower(dataclasses.replace(w, shapes=(DIMS,)))


def test_a_space_on_disk_is_read_back_as_built_and_a_torn_file_is_rebuilt(tmp_path):
    before = cache_dir()
    configure_cache(tmp_path)
    try:
        ir = _ir()
        S._SPACES.clear()
        built = S.space(ir, [DIMS])
        files = list((tmp_path / "spaces").glob("*.space"))
        assert len(files) == 1
        # another process (a prefork sibling) reads the file: the same schedules, in order
        code = (
            "import dataclasses, sys, time\n"
            "from factory.compile import cache_dir, configure_cache\n"
            f"configure_cache({str(tmp_path)!r})\n"
            "from factory.families.row import schedules as S\n"
            "from factory.families.row.ir import lower\n"
            "from factory.spec import load_catalogue\n"
            "S._build_space = None  # any build would fail: it must read the file\n"
            f"w = dataclasses.replace(load_catalogue()['rmsnorm'], shapes=({DIMS!r},))\n"
            f"print('|'.join(s.tag() for s in S.space(lower(w), [{DIMS!r}])))\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        assert out.split("|") == [s.tag() for s in built]
        # read back here too: equal schedules (they key dicts and sets, so hashes must agree)
        S._SPACES.clear()
        again = S.space(ir, [DIMS])
        assert again == built and {hash(s) for s in again} == {hash(s) for s in built}
        # a torn file is rebuilt and rewritten, never an error
        files[0].write_bytes(files[0].read_bytes()[:100])
        S._SPACES.clear()
        assert S.space(ir, [DIMS]) == built
        assert S._space_read(files[0]) == tuple(built)
    finally:
        configure_cache(before)
        S._SPACES.clear()


def test_only_the_most_recently_used_spaces_are_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(S, "SPACE_FILES_KEPT", 2)
    schedules = (S.Schedule(threads_per_row=128, rows_per_block=1, vec_elems=8, chunks=4),)
    paths = [tmp_path / "spaces" / f"{i}.space" for i in range(4)]
    for i, p in enumerate(paths):
        S._space_write(p, schedules)
        os.utime(p, (1_000_000 + i, 1_000_000 + i))  # distinct ages, whatever the clock's grain
    assert sorted(p.name for p in (tmp_path / "spaces").glob("*.space")) == ["2.space", "3.space"]


def test_without_a_cache_directory_nothing_is_written():
    before = cache_dir()
    configure_cache(None)
    try:
        assert S._space_path(("any",)) is None
    finally:
        configure_cache(before)
