"""`ptxf import`: the customer's PyTorch file in, a manifest out, on the customer's machine: no
server, no token. Untranslatable code is refused naming the node; bad usage exits 2."""

import textwrap

import pytest

torch = pytest.importorskip("torch")

from factory.spec import load_manifest  # noqa: E402
from portal import cli  # noqa: E402

MODEL = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F

    EPS = 1e-6


    def rmsnorm(x, w):
        return F.rms_norm(x, (x.shape[-1],), w, eps=EPS)


    def loss(logits, target):
        return F.cross_entropy(logits.float(), target, reduction="none")


    class Norm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(64))

        def forward(self, x):
            return F.rms_norm(x, (64,), self.weight, eps=EPS)


    def top(x):
        return torch.topk(x, 4).values
    """
)


@pytest.fixture
def model(tmp_path, monkeypatch):
    monkeypatch.delenv("PTXF_TOKEN", raising=False)  # import never talks to a server
    monkeypatch.setenv("PTXF_URL", "http://127.0.0.1:9")
    path = tmp_path / "model.py"
    path.write_text(MODEL)
    return path


def _run(capsys, *argv):
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_import_writes_a_manifest_that_loads(model, tmp_path, capsys):
    out = tmp_path / "rmsnorm.toml"
    code, stdout, err = _run(
        capsys,
        "import",
        f"{model}:rmsnorm",
        "--example-shapes",
        "x=16384x4096:bf16,w=4096:bf16:0.5..1.5",
        "--shape",
        "M=32768,N=4096",
        "-o",
        str(out),
    )
    assert code == 0, err
    assert "wrote" in stdout
    w = load_manifest(out.read_text())
    assert [(d.name, d.shape, d.dtype) for d in w.inputs] == [
        ("x", ("M", "N"), "bf16"),
        ("w", ("N",), "bf16"),
    ]
    assert (w.inputs[1].low, w.inputs[1].high) == (0.5, 1.5)
    assert [dict(s) for s in w.shapes] == [{"M": 16384, "N": 4096}, {"M": 32768, "N": 4096}]
    assert w.outputs[0].source == "x * rsqrt(mean(x * x, axis=-1, keepdims=True) + eps) * w"


def test_import_prints_the_manifest_without_an_output_file(model, capsys):
    code, stdout, _ = _run(
        capsys, "import", f"{model}:loss", "--example-shapes", "logits=64x1000:bf16,target=64:int64"
    )
    assert code == 0
    w = load_manifest(stdout)
    assert w.inputs[1].high == "V" and dict(w.shapes[0]) == {"M": 64, "V": 1000}


def test_import_instantiates_a_module_class_and_names_its_axes_as_asked(model, capsys):
    code, stdout, err = _run(
        capsys,
        "import",
        f"{model}:Norm",
        "--example-shapes",
        "x=8x64:fp32",
        "--dims",
        "x=TxD",
        "--name",
        "my-norm",
    )
    assert code == 0, err
    w = load_manifest(stdout)
    assert w.name == "my-norm"
    assert [(d.name, d.shape) for d in w.inputs] == [("x", ("T", "D")), ("weight", ("D",))]


def test_untranslatable_code_exits_1_naming_the_node_and_the_line(model, capsys):
    code, _, err = _run(capsys, "import", f"{model}:top", "--example-shapes", "x=8x64")
    assert code == 1
    assert "cannot translate node 'topk'" in err and "model.py:" in err and "torch.topk" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["{model}:nothing", "--example-shapes", "x=8x64"], "has no 'nothing'"),
        (["{model}", "--example-shapes", "x=8x64"], "expected FILE.py:NAME"),
        (["missing.py:f", "--example-shapes", "x=8x64"], "no such file"),
        (["{model}:rmsnorm", "--example-shapes", "x=8xN:bf16"], "must be integers"),
        (["{model}:rmsnorm", "--example-shapes", "x=8x64:int8"], "unknown dtype"),
        (["{model}:rmsnorm", "--example-shapes", "x=8x64:bf16:2..1"], "LOW..HIGH"),
    ],
)
def test_bad_usage_exits_2_with_the_reason(model, capsys, argv, message):
    code, _, err = _run(capsys, "import", *[a.format(model=model) for a in argv])
    assert code == 2
    assert message in err


def test_the_help_says_it_runs_your_code_on_your_machine(capsys):
    with pytest.raises(SystemExit):
        cli.main(["import", "--help"])
    text = capsys.readouterr().out
    assert "runs on YOUR machine" in text and "never runs" in text


def test_example_shapes_parse():
    assert cli.parse_example_shapes("x=2x3:bf16, i=2:int64, s=:fp32, m=4:bool:0..1") == [
        ("x", (2, 3), "bfloat16", None),
        ("i", (2,), "int64", None),
        ("s", (), "float32", None),
        ("m", (4,), "bool", (0.0, 1.0)),
    ]


def test_the_python_api_is_the_same_translation():
    def softmax(x):
        return torch.softmax(x, dim=-1)

    text = cli.from_torch(softmax, torch.randn(4, 32))
    assert load_manifest(text).outputs[0].name == "y"
