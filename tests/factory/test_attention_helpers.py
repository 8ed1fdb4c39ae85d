"""Shared by the attention tests: the lab's variant workloads, inputs as float64, and the numpy
model of the kernel's loop with the IR's score and mask functions bound to the extra inputs."""

import numpy as np

from factory.families.attention import tiling as T
from factory.spec import load_manifest
from factory.spec.reference import to_float64
from lab.attention.variants import manifest


def workload(variant, causal, d=64, shape=None, window=40):
    return load_manifest(manifest(variant, causal, d, shape=shape, window=window))


def f64(w, x, name):
    d = w.input(name)
    if d.dtype == "int32":
        return np.asarray(x[name]).astype(np.float64)
    return to_float64(x[name], d.dtype)


def simulate_bound(ir, bm, bn, q, k, v, extra, **kw):
    """tiling.simulate with the IR's score and mask functions bound to `extra`."""
    score_fn, mask_fn = T.ir_functions(ir)
    return T.simulate(
        ir,
        bm,
        bn,
        q,
        k,
        v,
        extra,
        score_fn=lambda s, i, j, h, b: score_fn(s, i, j, h, b, extra),
        mask_fn=lambda i, j, h, b: mask_fn(i, j, h, b, extra),
        **kw,
    )
