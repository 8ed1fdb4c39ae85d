"""The GPU worker: verify and time PTX candidates on a GPU host. No Django here.

`run_batch(batch: dict) -> dict` is the one entry point (docs/CONTRACTS.md, format 1); the command
line is `python -m gpuworker run BATCH.json -o RESULTS.json` and `python -m gpuworker probe`.
Importing this package initialises nothing: CUDA is only ever started in the worker's child.
"""


def run_batch(batch: dict, **kwargs) -> dict:
    from gpuworker.runner import run_batch as _run_batch

    return _run_batch(batch, **kwargs)


__all__ = ["run_batch"]
