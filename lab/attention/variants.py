"""The attention variants of issue 49 as manifests: plain, soft cap, ALiBi, sliding window and a
document mask, each causal or not, at a head dim. Shared by the bench and the CPU tests."""

from __future__ import annotations

VARIANTS = ("plain", "softcap", "alibi", "window", "document")
WINDOW = 1024


def args(variant: str, causal: bool, window: int = WINDOW) -> str:
    """The keywords of attention(q, k, v, ...) for a variant."""
    mask = ["j <= i"] if causal else []
    score = None
    if variant == "softcap":
        score = "30 * tanh(s / 30)"
    elif variant == "alibi":
        score = "s - slope[h] * abs(i - j)"
    elif variant == "window":
        mask += [f"i - j < {window}"] + ([] if causal else [f"j - i < {window}"])
    elif variant == "document":
        mask += ["doc[i] == doc[j]"]
    elif variant != "plain":
        raise ValueError(variant)
    out = ""
    if score:
        out += f", score='{score}'"
    if mask:
        out += ", mask=[" + ", ".join(f"'{m}'" for m in mask) + "]"
    return out


def manifest(
    variant: str,
    causal: bool,
    head_dim: int = 128,
    shape: dict | None = None,
    lse: bool = True,
    window: int = WINDOW,
) -> str:
    """TOML text of the variant; `shape` gives B, H, HKV, S (one shapes row)."""
    shape = shape or {"B": 1, "H": 4, "HKV": 2, "S": 300}
    a = args(variant, causal, window)
    extra = ""
    if variant == "alibi":
        extra = '[inputs.slope]\nshape = ["H"]\ndtype = "fp32"\nrange = [0.001, 0.1]\n'
    if variant == "document":
        extra = '[inputs.doc]\nshape = ["B", "S"]\ndtype = "int32"\nrange = [0, 4]\n'
    text = f'name = "attn_{variant}{"_causal" if causal else ""}"\ntarget = "sm_90"\n'
    for t, heads in (("q", "H"), ("k", "HKV"), ("v", "HKV")):
        text += f'[inputs.{t}]\nshape = ["B", "{heads}", "S", {head_dim}]\n'
        text += 'dtype = "bf16"\nrange = [-1.0, 1.0]\n'
    text += extra
    text += f'[outputs.o]\nshape = ["B", "H", "S", {head_dim}]\ndtype = "bf16"\n'
    text += f'expr = "attention(q, k, v{a})"\n'
    if lse:
        text += '[outputs.lse]\nshape = ["B", "H", "S"]\ndtype = "fp32"\n'
        text += f'expr = "attention_lse(q, k, v{a})"\n'
    text += "[[shapes]]\n" + "".join(f"{k} = {v}\n" for k, v in shape.items())
    return text
