"""One place turns a launch description's grid (counted in blocks) into a cuda.core config."""

import pytest

from gpuworker.gpu import launch_config


def test_a_plain_grid_passes_through_with_its_shared_memory():
    cfg = launch_config([6, 1, 1], [256, 1, 1], 100)
    assert (cfg.grid, cfg.block, cfg.shmem_size, cfg.cluster) == ((6, 1, 1), (256, 1, 1), 100, None)


def test_a_grid_that_is_not_a_multiple_of_its_cluster_is_refused_before_cuda_is_asked():
    # (a valid cluster needs a device to build the config; the GPU tests launch those)
    with pytest.raises(ValueError, match="not a multiple of cluster"):
        launch_config((6, 1, 1), (32, 1, 1), 0, (4, 1, 1))
