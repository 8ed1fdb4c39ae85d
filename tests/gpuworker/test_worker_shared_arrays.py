from multiprocessing import shared_memory

import numpy as np

from gpuworker.runner import _SharedArrays


def read_back(loc):
    if "shm" in loc:
        shm = shared_memory.SharedMemory(name=loc["shm"])
        try:
            return bytes(shm.buf[: loc["nbytes"]])
        finally:
            shm.close()
    return np.fromfile(loc["file"], dtype=np.uint8).tobytes()


def test_arrays_made_by_a_helper_survive_release_and_are_removed_by_the_adopter():
    judge = _SharedArrays()
    helper = _SharedArrays(tmpdir=judge.tmpdir_for_helpers())
    a = np.arange(1000, dtype=np.float64)
    loc = helper.put(a)
    helper.release()  # the helper process is done; the block must stay
    judge.adopt(loc)
    assert read_back(loc) == a.tobytes()
    judge.close()
    if "shm" in loc:
        try:
            shared_memory.SharedMemory(name=loc["shm"]).close()
            raise AssertionError("the block should have been unlinked")
        except FileNotFoundError:
            pass


def test_without_room_in_dev_shm_arrays_go_to_files(monkeypatch):
    monkeypatch.setattr(_SharedArrays, "_shm_room", staticmethod(lambda n: False))
    store = _SharedArrays()
    a = np.arange(10, dtype=np.uint16)
    loc = store.put(a)
    assert "file" in loc and read_back(loc) == a.tobytes()
    store.close()
