"""The blocked float64 attention reference: its key spans, shared masks, stacked query heads and
threads give the naive whole-tensor reference's result (1e-12), and the thread count changes
no bit of it."""

import json
from pathlib import Path

import numpy as np
import pytest

from factory.spec import attention as A
from factory.spec import load_manifest
from factory.spec.reference import random_inputs, reference, to_float64

HEAD = """
name = "attn_ref"
target = "sm_90"
[inputs.q]
shape = ["B", "H", "S", 8]
dtype = "fp32"
range = [-1.0, 1.0]
[inputs.k]
shape = ["B", "HKV", "T", 8]
dtype = "fp32"
range = [-1.0, 1.0]
[inputs.v]
shape = ["B", "HKV", "T", 8]
dtype = "fp32"
range = [-1.0, 1.0]
[inputs.slope]
shape = ["H"]
dtype = "fp32"
range = [0.1, 0.5]
[inputs.start]
shape = ["H"]
dtype = "int32"
range = [0, 9]
[inputs.doc]
shape = ["B", "T"]
dtype = "int32"
range = [0, 3]
[inputs.docq]
shape = ["B", "S"]
dtype = "int32"
range = [0, 3]
"""

SHAPE = {"B": 2, "H": 6, "HKV": 2, "S": 29, "T": 33}

# Each kind reaches a different path: masks shared by every head, per head (h or a per-head
# input), per batch entry (an input with a batch axis), after the scores (s), spans that start
# after key 0, blocks where no row keeps a key, scores that do not read s.
KINDS = {
    "softcap_causal": ", score='30 * tanh(s / 30)', mask='j <= i'",
    "window": ", mask=['j <= i', 'i - j < 4']",
    "late_window": ", mask=['j >= i', 'j - i < 6']",
    "empty_blocks": ", mask=['i >= 17', 'j <= i']",  # the first blocks keep nothing
    "per_head_start": ", mask=['j >= start[h]', 'j <= i + 3']",
    "per_head_h": ", score='s + slope[h] * (j - i)', mask='j <= i + h'",
    "document": ", mask=['docq[i] == doc[j]', 'j <= i + 5']",
    "on_scores": ", score='2 * tanh(s / 2)', mask=['s > -0.3', 'j <= i']",
    "no_s_score": ", score='0.01 * (i - j)', mask='j <= i'",
    "shared_subexpression": ", score='2 * tanh(s / 2)', mask=['tanh(s / 2) > -0.4', 'j <= i']",
    "where": ", score='where(j <= i, s * s, s - 1)', mask='j <= i + 2'",
    "plain": "",
}


def manifest(args: str) -> str:
    text = HEAD + '[outputs.o]\nshape = ["B", "H", "S", 8]\ndtype = "fp32"\n'
    text += f'expr = "attention(q, k, v{args})"\n'
    return text + "[[shapes]]\n" + "".join(f"{k} = {v}\n" for k, v in SHAPE.items())


def as_f64(w, inputs):
    out = {}
    for d in w.inputs:
        a = np.asarray(inputs[d.name])
        out[d.name] = a.astype(np.float64) if d.dtype == "int32" else to_float64(a, d.dtype)
    return out


def both_parts(node, x):
    """(out, lse) from the blocked reference, straight from its one pass."""
    extra = {e.name: x[e.name] for e in node.extra}
    return A._attention_both(node, x["q"], x["k"], x["v"], extra)


@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_blocked_reference_matches_the_naive_one(kind, threads, monkeypatch):
    monkeypatch.setattr(A, "QUERY_BLOCK", 5)  # several blocks, the last partial
    monkeypatch.setenv(A.THREADS_ENV, str(threads))
    w = load_manifest(manifest(KINDS[kind]))
    x = as_f64(w, random_inputs(w, SHAPE, seed=11))
    node = w.outputs[0].expr
    extra = {e.name: x[e.name] for e in node.extra}
    out, lse = both_parts(node, x)
    lse_node = A.dataclasses.replace(node, part="lse", shape=node.shape[:3])
    want_out = A.naive_reference(node, x["q"], x["k"], x["v"], extra)
    want_lse = A.naive_reference(lse_node, x["q"], x["k"], x["v"], extra)
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-12)
    assert np.array_equal(np.isneginf(lse), np.isneginf(want_lse))  # the same empty rows
    kept = np.isfinite(want_lse)
    np.testing.assert_allclose(lse[kept], want_lse[kept], rtol=1e-12, atol=1e-12)


def test_the_empty_rows_are_zero_with_lse_minus_infinity(monkeypatch):
    monkeypatch.setattr(A, "QUERY_BLOCK", 5)
    w = load_manifest(manifest(KINDS["empty_blocks"]))
    x = as_f64(w, random_inputs(w, SHAPE, seed=2))
    out, lse = both_parts(w.outputs[0].expr, x)
    assert np.all(out[:, :, :17] == 0.0) and np.all(lse[:, :, :17] == -np.inf)
    assert np.all(np.isfinite(lse[:, :, 17:])) and np.all(out[:, :, 17:] != 0.0)


@pytest.mark.parametrize("kind", ["softcap_causal", "per_head_h", "document", "on_scores"])
def test_the_thread_count_changes_no_bit(kind, monkeypatch):
    monkeypatch.setattr(A, "QUERY_BLOCK", 7)
    w = load_manifest(manifest(KINDS[kind]))
    x = as_f64(w, random_inputs(w, SHAPE, seed=5))
    node = w.outputs[0].expr
    results = []
    for threads in (1, 2, 3, 12):
        monkeypatch.setenv(A.THREADS_ENV, str(threads))
        results.append(both_parts(node, x))
    for out, lse in results[1:]:
        assert np.array_equal(out, results[0][0]) and np.array_equal(lse, results[0][1])


def test_the_thread_count_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(A.THREADS_ENV, raising=False)
    assert A.reference_threads() == 1
    for text, want in (("3", 3), ("0", 1), ("1000", 64), ("many", 1)):
        monkeypatch.setenv(A.THREADS_ENV, text)
        assert A.reference_threads() == want


def test_the_key_span_runs_from_the_first_kept_key_to_the_last():
    keep = np.zeros((3, 10), dtype=bool)
    assert A._key_span(~keep, 10) == (0, 0)
    keep[1, 4] = keep[2, 7] = True
    assert A._key_span(~keep, 10) == (4, 8)
    assert A._key_span(None, 10) == (0, 10)
    heads = np.zeros((2, 3, 10), dtype=bool)
    heads[1, 0, 9] = heads[0, 2, 2] = True
    assert A._key_span(~heads, 10) == (2, 10)


def test_keys_outside_every_rows_span_are_never_read(monkeypatch):
    # causal: block [0, 5) keeps keys 0..4 only; keys beyond are replaced by NaN, and the first
    # block's rows must not change (a reference multiplying all keys would turn them NaN)
    monkeypatch.setattr(A, "QUERY_BLOCK", 5)
    w = load_manifest(manifest(KINDS["softcap_causal"]))
    x = as_f64(w, random_inputs(w, SHAPE, seed=7))
    node = w.outputs[0].expr
    out, lse = both_parts(node, x)
    poisoned = dict(x, k=x["k"].copy(), v=x["v"].copy())
    poisoned["k"][:, :, 5:] = np.nan
    poisoned["v"][:, :, 5:] = np.nan
    out2, lse2 = both_parts(node, poisoned)
    assert np.array_equal(out2[:, :, :5], out[:, :, :5])
    assert np.array_equal(lse2[:, :, :5], lse[:, :, :5])


def test_the_portal_jobs_softcap_batch_matches_the_naive_reference(monkeypatch):
    # the manifest of the attention batch that ran out of time on the H100 (head dim 128, bf16),
    # at a shape with a full and a partial 256-row block
    batch = Path(__file__).resolve().parents[2] / "lab" / "gpujobs" / "batches" / "attention.json"
    if not batch.exists():
        pytest.skip("no exported attention batch here")
    w = load_manifest(json.loads(batch.read_text())["manifest"])
    dims = {"B": 1, "H": 2, "S": 300}
    monkeypatch.setenv(A.THREADS_ENV, "2")
    inputs = random_inputs(w, dims, seed=9)
    got = reference(w, inputs, dims)
    x = as_f64(w, inputs)
    want = A.naive_reference(w.outputs[0].expr, x["q"], x["k"], x["v"], {})
    name = w.outputs[0].name
    np.testing.assert_allclose(got[name], want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["per_head_h", "per_head_start", "document"])
def test_unstacked_query_heads_give_the_same_result(kind, monkeypatch):
    # a group of 3 query heads per kv head: stacked in one product, or one head at a time
    monkeypatch.setattr(A, "QUERY_BLOCK", 6)
    w = load_manifest(manifest(KINDS[kind]))
    x = as_f64(w, random_inputs(w, SHAPE, seed=13))
    node = w.outputs[0].expr
    stacked = both_parts(node, x)
    monkeypatch.setattr(A, "STACK_ELEMENTS", 1)
    single = both_parts(node, x)
    for a, b in zip(stacked, single, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)
