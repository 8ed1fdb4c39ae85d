"""The torch forms of examples/reference.py for scan, arg-reduce, pool and attention nodes,
each compared with the factory's own float64 reference (factory.spec.reference) on small
shapes of the example manifests; and an artifact whose operator has no torch form, which
ships without examples/reference.py and says so."""

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest

from factory.spec import expr as E
from factory.spec import load_manifest, random_inputs, reference
from portal import artifacts
from portal.artifacts import build_artifact, verify_checksums
from tests.portal.test_artifact_readme import _fake_compile, _inputs_for, _module, _unpack

torch = pytest.importorskip("torch")

EXAMPLES = Path(__file__).resolve().parents[2] / "factory" / "examples"
# small sizes of the examples' own dims; a pooled dim follows from its axis
SMALL = {"B": 2, "H": 4, "HKV": 2, "S": 11, "M": 5, "V": 33, "T": 13, "N": 2, "C": 3, "W": 10}


def _small_dims(w, **over) -> dict:
    dims = {k: over.get(k, SMALL.get(k, 6)) for k in w.shapes[0] if not _is_pooled(w, k)}
    for o in w.outputs:
        for n in E.walk(o.expr):
            if isinstance(n, E.Pool):
                axes = n.x.shape[-len(n.window) :]
                for d, win, st, pad in zip(axes, n.window, n.stride, n.padding, strict=True):
                    if isinstance(d, str):
                        dims[E.pooled_dim_name(d, win, st, pad)] = E.pooled_size(
                            dims[d], win, st, pad
                        )
    return dims


def _is_pooled(w, name: str) -> bool:
    for o in w.outputs:
        for n in E.walk(o.expr):
            if isinstance(n, E.Pool):
                axes = n.x.shape[-len(n.window) :]
                for d, win, st, pad in zip(axes, n.window, n.stride, n.padding, strict=True):
                    if isinstance(d, str) and E.pooled_dim_name(d, win, st, pad) == name:
                        return True
    return False


def _as_torch(w, inputs: dict) -> dict:
    out = {}
    for d in w.inputs:
        arr = inputs[d.name]
        out[d.name] = (
            torch.from_numpy(arr.view(np.int16).copy()).view(torch.bfloat16)
            if d.dtype == "bf16"
            else torch.from_numpy(np.ascontiguousarray(arr).copy())
        )
    return out


def _reference_module(w, tmp_path, name):
    built = build_artifact(_inputs_for(w), compile_fn=_fake_compile)
    folder = _unpack(built, tmp_path)
    return _module(folder / "examples" / "reference.py", name), folder


def _check(w, tmp_path, dims, inputs=None, name="ref"):
    ref_module, folder = _reference_module(w, tmp_path, name)
    inputs = inputs if inputs is not None else random_inputs(w, dims, seed=5)
    expected = reference(w, inputs, dims)
    got = ref_module.reference(_as_torch(w, inputs))
    for o in w.outputs:
        assert got[o.name].dtype in (torch.float64, torch.int64), o.name
        np.testing.assert_allclose(
            got[o.name].numpy().astype(np.float64), expected[o.name], rtol=1e-9, atol=1e-12
        )
    return ref_module, folder


@pytest.mark.parametrize(
    "example",
    [
        "attention_alibi",
        "attention_gqa",
        "attention_document_mask",
        "attention_sliding_window",
        "scan_reverse_exclusive_logcumprod",
        "scan_cumsum_rows",
        "argreduce_greedy_sampling",
        "pool_avgpool1d",
        "pool_maxpool2d_nchw",
    ],
)
def test_the_examples_reference_matches_the_factorys(example, tmp_path):
    w = load_manifest((EXAMPLES / f"{example}.toml").read_text())
    _check(w, tmp_path, _small_dims(w), name=f"ref_{example}")


def test_attention_over_several_query_blocks(tmp_path):
    # S = 300: the torch form's blocks of 256 queries end inside the sequence
    w = load_manifest((EXAMPLES / "attention_alibi.toml").read_text())
    _check(w, tmp_path, _small_dims(w, B=1, H=2, S=300), name="ref_alibi_long")


STRICT_TOML = """name = "strict-causal"
[inputs.q]
shape = ["B", "H", "S", 16]
dtype = "fp32"
range = [-1.0, 1.0]
[inputs.k]
shape = ["B", "HKV", "S", 16]
dtype = "fp32"
range = [-1.0, 1.0]
[inputs.v]
shape = ["B", "HKV", "S", 16]
dtype = "fp32"
range = [-1.0, 1.0]
[inputs.slope]
shape = ["H"]
dtype = "fp32"
range = [0.0, 1.0]
[outputs.o]
expr = "attention(q, k, v, score='20 * tanh(s / 20) - slope[h] * (i - j)', mask='j < i', scale=0.5)"
dtype = "fp32"
shape = ["B", "H", "S", 16]
[outputs.lse]
expr = "attention_lse(q, k, v, score='20 * tanh(s / 20) - slope[h] * (i - j)', mask='j <= i', scale=0.5)"
dtype = "fp32"
shape = ["B", "H", "S"]
[[shapes]]
B = 2
H = 4
HKV = 2
S = 64
"""  # noqa: E501


def test_attention_out_and_lse_with_a_row_that_keeps_no_key(tmp_path):
    # o's mask j < i keeps no key for query 0: its output is zero. A manifest cannot have an
    # infinite output, so the -inf log-sum-exp of such a row is checked on the helper itself,
    # called with o's score and mask functions, against the factory's lse of the same node.
    import dataclasses

    from factory.spec.attention import attention_reference

    w = load_manifest(STRICT_TOML)
    dims = {"B": 2, "H": 4, "HKV": 2, "S": 12}
    inputs = random_inputs(w, dims, seed=9)
    ref_module, _ = _check(w, tmp_path, dims, inputs, name="ref_strict")
    t = {k: x.to(torch.float64) for k, x in _as_torch(w, inputs).items()}
    got = ref_module.reference(_as_torch(w, inputs))
    assert torch.all(got["o"][:, :, 0] == 0) and torch.any(got["o"][:, :, 1] != 0)

    node = next(o.expr for o in w.outputs if o.name == "o")
    score = next(getattr(ref_module, n) for n in dir(ref_module) if n.startswith("_score_"))
    masks = [getattr(ref_module, n) for n in sorted(dir(ref_module)) if n.startswith("_mask_")]
    assert len(masks) == 2  # o's j < i and lse's j <= i, in that order by name
    lse = ref_module._attention(
        t["q"], t["k"], t["v"], {"slope": t["slope"]}, 0.5, score, masks[:1], "lse", block=5
    )
    expected = attention_reference(
        dataclasses.replace(node, part="lse"),
        *(inputs[n].astype(np.float64) for n in ("q", "k", "v")),
        {"slope": inputs["slope"].astype(np.float64)},
    )
    assert torch.all(lse[:, :, 0] == float("-inf")) and torch.isfinite(lse[:, :, 1:]).all()
    np.testing.assert_allclose(lse.numpy(), expected, rtol=1e-9, atol=1e-12)


def test_argmax_takes_the_first_index_on_ties(tmp_path):
    w = load_manifest((EXAMPLES / "argreduce_greedy_sampling.toml").read_text())
    dims = {"M": 4, "V": 9}
    logits = np.zeros((4, 9), dtype=np.float32)
    logits[1, [2, 5]] = 1.0
    logits[2, [8, 0]] = 3.0
    logits[3, :] = -1.0
    bits = (logits.view(np.uint32) >> 16).astype(np.uint16)  # exact in bf16
    ref_module, _ = _check(w, tmp_path, dims, {"logits": bits}, name="ref_ties")
    got = ref_module.reference(_as_torch(w, {"logits": bits}))
    assert got["token"].tolist() == [0, 2, 0, 0]


def test_scan_forms_cover_exclusive_and_reverse(tmp_path):
    for k, (op, flags) in enumerate(
        [("cumsum", ""), ("cumsum", ", exclusive=True"), ("cumprod", ", reverse=True")]
    ):
        text = (
            'name = "scan"\n[inputs.x]\nshape = ["M", "T"]\ndtype = "fp32"\nrange = [0.5, 1.5]\n'
            f'[outputs.y]\nexpr = "{op}(x, axis=-1{flags})"\ndtype = "fp32"\n'
            "[[shapes]]\nM = 4\nT = 16\n"
        )
        w = load_manifest(text)
        _check(w, tmp_path / str(k), {"M": 3, "T": 7}, name=f"ref_scan_{k}")


# -- an operator with no torch form ----------------------------------------------------------------


def test_an_operator_without_a_torch_form_ships_without_the_reference(monkeypatch, tmp_path):
    from factory.spec import load_catalogue

    w = load_catalogue()["rmsnorm"]
    # rmsnorm uses rsqrt: without its torch form the translation fails, as a new node kind would
    monkeypatch.setattr(
        artifacts, "_TORCH_UNARY", {k: v for k, v in artifacts._TORCH_UNARY.items() if k != "rsqrt"}
    )
    built = build_artifact(_inputs_for(w), compile_fn=_fake_compile)
    assert verify_checksums(built.data) == []
    with zipfile.ZipFile(io.BytesIO(built.data)) as z:
        names = z.namelist()
        assert "examples/reference.py" not in names
        readme = z.read("README.md").decode()
        assert "No PyTorch reference is included for this operator" in readme
        assert "(no torch form for Unary rsqrt)" in readme
        assert "examples/reference.py" not in readme
        for name in ("examples/load_torch.py", "examples/load_cuda_python.py"):
            source = z.read(name).decode()
            compile(source, name, "exec")
            assert "import reference" not in source and "from reference" not in source
            words = " ".join(source.split()).lower()
            assert "no pytorch reference is included for this operator" in words
    # the torch loader still imports and checks inputs without a reference module next to it
    folder = _unpack(built, tmp_path)
    loader = _module(folder / "examples" / "load_torch.py", "load_torch_no_reference")
    with pytest.raises(TypeError, match="x must be torch.bfloat16"):
        loader.run(torch.zeros(4, 64), torch.zeros(64, dtype=torch.bfloat16), {"M": 4, "N": 64})


def test_with_the_torch_form_the_same_artifact_ships_the_reference():
    from factory.spec import load_catalogue

    built = build_artifact(_inputs_for(load_catalogue()["rmsnorm"]), compile_fn=_fake_compile)
    with zipfile.ZipFile(io.BytesIO(built.data)) as z:
        assert "examples/reference.py" in z.namelist()
        assert "No PyTorch reference" not in z.read("README.md").decode()
        assert "from reference import" in z.read("examples/load_torch.py").decode()
