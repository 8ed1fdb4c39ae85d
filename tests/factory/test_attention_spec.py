"""The attention operator of the manifest language and its blocked float64 reference, checked
against a naive whole-tensor reference at small shapes for every score and mask kind."""

import dataclasses

import numpy as np
import pytest

from factory.spec import SpecError, load_manifest
from factory.spec import attention as A
from factory.spec.reference import random_inputs, reference

HEAD = """
name = "attn"
target = "sm_90"
[inputs.q]
shape = ["B", "H", "S", 16]
dtype = "bf16"
range = [-1.0, 1.0]
[inputs.k]
shape = ["B", "HKV", "T", 16]
dtype = "bf16"
range = [-1.0, 1.0]
[inputs.v]
shape = ["B", "HKV", "T", 16]
dtype = "bf16"
range = [-1.0, 1.0]
[inputs.slope]
shape = ["H"]
dtype = "fp32"
range = [0.1, 0.5]
[inputs.doc]
shape = ["B", "T"]
dtype = "int32"
range = [0, 3]
[inputs.docq]
shape = ["B", "S"]
dtype = "int32"
range = [0, 3]
"""


def manifest(args: str, lse: bool = True, shape=None) -> str:
    shape = shape or {"B": 2, "H": 4, "HKV": 2, "S": 37, "T": 45}
    text = HEAD + '[outputs.o]\nshape = ["B", "H", "S", 16]\ndtype = "bf16"\n'
    text += f'expr = "attention(q, k, v{args})"\n'
    if lse:
        text += '[outputs.lse]\nshape = ["B", "H", "S"]\ndtype = "fp32"\n'
        text += f'expr = "attention_lse(q, k, v{args})"\n'
    text += "[[shapes]]\n" + "".join(f"{k} = {v}\n" for k, v in shape.items())
    return text


KINDS = {
    "plain": "",
    "causal": ", mask='j <= i'",
    "softcap": ", score='30 * tanh(s / 30)'",
    "softcap_small": ", score='2 * tanh(s / 2)', mask=['j <= i']",
    "alibi": ", score='s + slope[h] * (j - i)', mask='j <= i'",
    "window": ", mask=['j <= i', 'i - j < 5']",
    "document": ", mask=['docq[i] == doc[j]']",
    "scale": ", scale=0.5",
    "strict": ", mask='j < i'",  # row 0 keeps no key
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_blocked_reference_matches_the_naive_one(kind, monkeypatch):
    # a row with no key has lse -inf, which the manifest's smoke test refuses: no lse there
    w = load_manifest(manifest(KINDS[kind], lse=kind != "strict"))
    dims = w.shapes[0]
    inputs = random_inputs(w, dims, seed=3)
    monkeypatch.setattr(A, "QUERY_BLOCK", 8)  # several blocks, the last partial
    got = reference(w, inputs, dims)
    node = w.outputs[0].expr
    f64 = {n: reference_input(w, inputs, n) for n in inputs}
    extra = {x.name: f64[x.name] for x in node.extra}
    for o in w.outputs:
        want = A.naive_reference(o.expr, f64["q"], f64["k"], f64["v"], extra)
        np.testing.assert_allclose(got[o.name], want, rtol=1e-12, atol=1e-12)
    assert np.all(np.isfinite(got["o"]))


def reference_input(w, inputs, name):
    from factory.spec.reference import to_float64

    d = w.input(name)
    if d.dtype in ("int32", "int64"):
        return np.asarray(inputs[name]).astype(np.float64)
    return to_float64(inputs[name], d.dtype)


def test_a_row_with_no_key_left_is_zero_with_lse_minus_infinity():
    w = load_manifest(manifest(KINDS["strict"], lse=False))
    dims = w.shapes[0]
    x = {n: reference_input(w, random_inputs(w, dims, seed=1), n) for n in ("q", "k", "v")}
    node = w.outputs[0].expr
    o = A.attention_reference(node, x["q"], x["k"], x["v"], {})
    lse_node = dataclasses.replace(node, part="lse", shape=node.shape[:3])
    lse = A.attention_reference(lse_node, x["q"], x["k"], x["v"], {})
    assert np.all(o[:, :, 0] == 0.0) and np.all(lse[:, :, 0] == -np.inf)
    assert np.all(np.isfinite(lse[:, :, 1:])) and np.all(np.abs(o[:, :, 1:]) > 0)


def test_causal_output_does_not_depend_on_future_keys():
    w = load_manifest(manifest(KINDS["causal"], shape={"B": 1, "H": 2, "HKV": 1, "S": 20, "T": 20}))
    dims = w.shapes[0]
    x = random_inputs(w, dims, seed=5)
    a = reference(w, x, dims)["o"]
    x2 = {k: np.array(v) for k, v in x.items()}
    x2["k"][:, :, 10:] = x2["k"][:, :, :10][:, :, ::-1]
    x2["v"][:, :, 10:] = 0
    b = reference(w, x2, dims)["o"]
    np.testing.assert_array_equal(a[:, :, :10], b[:, :, :10])
    assert not np.allclose(a[:, :, 10:], b[:, :, 10:])


def test_gqa_heads_read_their_group_kv_head():
    w = load_manifest(manifest("", lse=False, shape={"B": 1, "H": 4, "HKV": 2, "S": 6, "T": 6}))
    dims = w.shapes[0]
    x = random_inputs(w, dims, seed=2)
    x["q"][:, 1] = x["q"][:, 0]
    x["q"][:, 2] = x["q"][:, 0]
    o = reference(w, x, dims)["o"]
    np.testing.assert_array_equal(o[:, 0], o[:, 1])  # heads 0, 1 share kv head 0
    assert not np.allclose(o[:, 0], o[:, 2])  # head 2 reads kv head 1


def test_heldout_shapes_have_odd_sequence_lengths():
    w = load_manifest(manifest("", shape={"B": 4, "H": 4, "HKV": 2, "S": 4096, "T": 4096}))
    for row in w.heldout_shapes:
        assert row["S"] % 2 == 1 and row["T"] % 2 == 1
        assert row["H"] == 4 and row["HKV"] == 2


@pytest.mark.parametrize(
    "args, words",
    [
        (", score='__import__(1)'", "unknown function"),
        (", score='(lambda: 1)()'", "plain name"),
        (", score='exec(1)'", "unknown function"),
        (", score='s.real'", "attribute"),
        (", score='q'", "subscript"),
        (", score='slope[i]'", "must have shape"),
        (", score='slope[s]'", "index must be i, j or h"),
        (", score='j <= i'", "not a comparison"),
        (", mask='i - j'", "comparison"),
        (", mask='j <= i', bad=1", "unexpected keyword"),
        (", score=3", "quoted expression"),
        (", scale=-1", "positive"),
    ],
)
def test_it_refuses_bad_score_and_mask_text(args, words):
    with pytest.raises(SpecError) as e:
        load_manifest(manifest(args, lse=False))
    assert words in str(e.value)


def test_it_refuses_mismatched_q_and_k():
    text = manifest("", lse=False).replace('"T", 16]', '"T", 8]')
    with pytest.raises(SpecError) as e:
        load_manifest(text)
    assert "head dim" in str(e.value)
