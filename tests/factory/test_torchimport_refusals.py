"""What `from_torch` cannot translate, it refuses by name: the graph node, its operator, the
customer's source line, and why."""

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from factory.torchimport import TranslationError, from_torch  # noqa: E402


def _refusal(fn, *examples) -> TranslationError:
    with pytest.raises(TranslationError) as info:
        from_torch(fn, *examples)
    return info.value


def sorts(x):
    y = x * 2
    return torch.sort(y, dim=-1).values


def test_an_unsupported_op_names_the_node_the_operator_and_the_source_line():
    err = _refusal(sorts, torch.randn(4, 32))
    assert err.node == "sort"
    assert "aten.sort" in err.target
    assert "test_torchimport_refusals.py" in err.source and "torch.sort" in err.source
    message = str(err)
    assert message.startswith("cannot translate node 'sort' (aten.sort")
    assert "no equivalent in the manifest language" in message


def test_an_unbiased_variance_is_refused_with_the_fix():
    err = _refusal(lambda x: x.var(dim=-1), torch.randn(4, 32))
    assert "var" in err.node and "correction=0" in str(err)


def test_a_reshape_that_merges_axes_is_refused():
    err = _refusal(lambda x: x.reshape(-1) * 2, torch.randn(4, 32))
    assert "merges or splits axes" in str(err) and err.node


def test_chunk_is_refused_by_name():
    def swiglu_fused(x):
        a, b = x.chunk(2, dim=-1)
        return F.silu(a) * b

    err = _refusal(swiglu_fused, torch.randn(4, 64))
    assert "chunk" in err.node or "split" in err.node or "slice" in err.node
    assert err.target


def test_an_integer_output_is_refused():
    # only an argmax/argmin's index may be an integer output
    err = _refusal(lambda t: t * 2, torch.randint(0, 8, (4, 32)))
    assert "int64" in str(err) and "argmax" in str(err)


def test_computed_gather_indices_are_refused():
    def f(x, t):
        return x.gather(-1, (t + 1).unsqueeze(-1)).squeeze(-1)

    err = _refusal(f, torch.randn(4, 32), torch.randint(0, 31, (4,)))
    assert err.node == "gather" and "integer inputs" in str(err)


def test_float64_inputs_are_refused_with_the_fix():
    err = _refusal(lambda x: x * 2, torch.randn(4, 32, dtype=torch.float64))
    assert "fp64" in str(err) and "x.float()" in str(err)


def test_non_tensor_example_inputs_are_refused():
    with pytest.raises(TranslationError, match="must be a tensor"):
        from_torch(lambda x, s: x * s, torch.randn(4, 8), 2.0)


def test_an_in_place_update_of_a_buffer_is_refused():
    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("seen", torch.zeros(8))

        def forward(self, x):
            self.seen.add_(x.sum(0))
            return x * 2

    err = _refusal(Counter(), torch.randn(4, 8))
    assert "in place" in str(err)


def test_dropout_in_training_mode_asks_for_eval():
    model = torch.nn.Sequential(torch.nn.Dropout(0.1))
    model.train()
    err = _refusal(model, torch.randn(4, 8))
    assert "eval()" in str(err)
    model.eval()
    assert "[outputs.y]" in from_torch(model, torch.randn(4, 8))


# -- pooling, instance norm, argmax and mse_loss: the variants the language has no form for -------


def test_max_pool2d_with_dilation_is_refused_naming_the_argument():
    err = _refusal(lambda x: F.max_pool2d(x, 3, 1, 1, dilation=2), torch.randn(2, 3, 12, 10))
    assert err.node == "max_pool2d" and "dilation=[2, 2]" in str(err)


def test_max_pool2d_with_ceil_mode_is_refused_naming_the_argument():
    err = _refusal(torch.nn.MaxPool2d(3, 2, ceil_mode=True), torch.randn(2, 3, 12, 10))
    assert "ceil_mode=True" in str(err) and "ceil_mode=False" in str(err)


def test_the_indices_of_max_pool2d_are_refused_naming_return_indices():
    def f(x):
        y, idx = F.max_pool2d(x, 2, return_indices=True)
        return y, idx

    err = _refusal(f, torch.randn(2, 3, 12, 10))
    assert "return_indices=True" in str(err)


@pytest.mark.parametrize("key, value", [("kernel_size", 65), ("stride", 64)])
def test_a_max_pool2d_window_or_stride_beyond_the_language_is_refused(key, value):
    kw = {"kernel_size": 2, key: value}
    err = _refusal(lambda x: F.max_pool2d(x, **kw), torch.randn(1, 2, 70, 70))
    assert f"{key}=[{value}, {value}]" in str(err) and "1..63" in str(err)


def test_argmax_without_dim_is_refused_asking_for_dim():
    err = _refusal(lambda x: torch.argmax(x), torch.randn(4, 32))
    assert err.node == "argmax" and "without dim" in str(err) and "dim=-1" in str(err)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.argmax(dim=-1).float(),
        lambda x: (x.argmax(dim=-1) == 3).float(),
        lambda x: x.argmax(dim=-1) + 1,
    ],
    ids=["to_float", "compared", "added"],
)
def test_computing_with_an_argmax_is_refused(fn):
    err = _refusal(fn, torch.randn(4, 32))
    assert "argmax/argmin" in str(err) and "only ever an output" in str(err)


def test_instance_norm_with_running_statistics_is_refused():
    model = torch.nn.InstanceNorm2d(3, track_running_stats=True).eval()
    err = _refusal(model, torch.randn(2, 3, 12, 10))
    assert err.node == "instance_norm" and "track_running_stats" in str(err)


def test_instance_norm_of_a_computed_weight_is_refused():
    def f(x, w):
        return F.instance_norm(x, weight=w * 2)

    err = _refusal(f, torch.randn(2, 3, 12, 10), torch.randn(3))
    assert "instance_norm's weight" in str(err) and "computed" in str(err)


def test_a_weight_used_as_it_is_and_along_the_channels_is_refused():
    def f(x, w):
        return F.instance_norm(x, weight=w) + w

    err = _refusal(f, torch.randn(2, 3, 12, 3), torch.randn(3))
    assert "'w'" in str(err) and "two inputs" in str(err)


# -- scans: what cumsum/cumprod(x, axis=..., exclusive=..., reverse=...) cannot say --------------


def test_a_flip_on_its_own_is_refused_naming_the_reverse_scan():
    err = _refusal(lambda x: x.flip(-1) * 2, torch.randn(4, 32))
    assert err.node == "flip" and "aten.flip" in err.target
    assert "x.flip(d).cumsum(d).flip(d)" in str(err) and "reverse=True" in str(err)


def test_a_cumsum_of_a_flip_not_flipped_back_is_refused():
    err = _refusal(lambda x: x.flip(-1).cumsum(-1), torch.randn(4, 32))
    assert err.node == "cumsum" and "flip" in str(err) and "reverse=True" in str(err)


def test_a_flip_along_another_axis_than_the_scan_is_refused():
    err = _refusal(lambda x: x.flip(0).cumsum(1).flip(1), torch.randn(4, 32))
    assert "flip" in str(err) and "reverse=True" in str(err)


@pytest.mark.parametrize(
    "dtype, words",
    [(torch.float64, "dtype=torch.float64"), (torch.int64, "dtype=torch.int64")],
    ids=["float64", "int64_of_floats"],
)
def test_a_cumsum_dtype_the_language_cannot_scan_in_is_refused_naming_it(dtype, words):
    err = _refusal(lambda x: x.cumsum(-1, dtype=dtype).float(), torch.randn(4, 32))
    assert err.node == "cumsum" and words in str(err)


def test_a_cumsum_of_an_integer_tensor_is_refused_with_the_fix():
    err = _refusal(lambda t: t.cumsum(-1).float(), torch.randint(0, 8, (4, 32)))
    assert err.node == "cumsum" and "integer tensor" in str(err) and "x.float()" in str(err)


def test_a_cumsum_along_a_broadcast_axis_is_refused():
    def f(x, b):
        return b.expand_as(x).cumsum(0) + x

    err = _refusal(f, torch.randn(4, 32), torch.randn(32))
    assert err.node == "cumsum" and "broadcast" in str(err)


@pytest.mark.parametrize(
    "fn, name",
    [
        (lambda x: x.cummax(-1).values, "cummax"),
        (lambda x: torch.cummin(x, 0).values, "cummin"),
        (lambda x: torch.logcumsumexp(x, -1), "logcumsumexp"),
    ],
    ids=["cummax", "cummin", "logcumsumexp"],
)
def test_scans_other_than_cumsum_and_cumprod_are_refused_by_name(fn, name):
    err = _refusal(fn, torch.randn(4, 32))
    assert err.node == name and "cumsum and cumprod" in str(err)
