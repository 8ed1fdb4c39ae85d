"""Bring PyTorch code: translate a PyTorch function or nn.Module into a workload manifest.

    from factory.torchimport import from_torch
    text = from_torch(my_rmsnorm, x, w)           # the manifest TOML, ready to upload

Runs on the customer's own machine (`ptxf import` or this API): their Python is traced there with
torch.export and only the manifest text it writes is ever uploaded; the portal never runs
customer Python. torch is imported lazily, when a translation starts. No Django here.

What translates, and how: docs/PYTORCH.md.
"""

from __future__ import annotations

from factory.torchimport.translate import TranslationError

__all__ = ["TranslationError", "from_torch"]


def from_torch(
    fn_or_module,
    *example_inputs,
    name: str | None = None,
    shapes: list[dict] | None = None,
    dims: dict | None = None,
    outputs: list[str] | None = None,
    target: str = "sm_90",
    description: str | None = None,
    ranges: dict | None = None,
    validate: bool = True,
) -> str:
    """The manifest (TOML text) of `fn_or_module` applied to `example_inputs` (tensors).

    Dims are named from the example shapes (axes of equal size share a name; M, N for a row
    operator, M, N, K for a matmul, V for a gathered vocabulary) and the example sizes are the
    first [[shapes]] row; `shapes` adds more rows ({"M": 32768, "N": 4096}), `dims` names the
    axes yourself ({"x": "MxN", "w": "N"}), `outputs` names the outputs, `ranges` sets the
    value range the judge draws an input from ({"w": (0.5, 1.5)}; by default the example's
    data gives it, or [-4, 4] for placeholder tensors). Raises
    TranslationError naming the graph node that has no equivalent and why. With `validate`,
    the text is loaded with factory.spec.load_manifest before it is returned (a TranslationError
    lists the loader's complaints)."""
    from factory.torchimport.translate import translate

    text = translate(
        fn_or_module,
        tuple(example_inputs),
        name=name,
        shapes=shapes,
        dims=dims,
        outputs=outputs,
        target=target,
        description=description,
        ranges=ranges,
    )
    if validate:
        from factory.spec import SpecError, load_manifest

        try:
            load_manifest(text)
        except SpecError as e:
            problems = "; ".join(f"{f}: {p}" for f, p in e.errors)
            raise TranslationError(
                f"the translated manifest does not load: {problems}\n--- manifest ---\n{text}"
            ) from None
    return text
