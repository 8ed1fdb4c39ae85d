"""Workload specifications: the manifest format, the operator expression language, the float64
reference, random inputs, the catalogue and customer baseline kernels. No Django here.

See docs/CONTRACTS.md ("factory.spec") for the contract other packages rely on."""

from factory.spec.catalogue import catalogue_manifest, catalogue_names, load_catalogue
from factory.spec.dims import eval_dim_expr
from factory.spec.manifest import DEFAULT_TOLERANCE, decode_text, load_manifest
from factory.spec.reference import (
    STORAGE_DTYPES,
    concrete_shape,
    random_inputs,
    reference,
    to_float64,
    to_storage,
)
from factory.spec.types import (
    BaselineKernel,
    KernelParam,
    Launch,
    OutputDecl,
    SpecError,
    TensorDecl,
    Tolerance,
    Workload,
)

__all__ = [
    "DEFAULT_TOLERANCE",
    "STORAGE_DTYPES",
    "BaselineKernel",
    "KernelParam",
    "Launch",
    "OutputDecl",
    "SpecError",
    "TensorDecl",
    "Tolerance",
    "Workload",
    "catalogue_manifest",
    "catalogue_names",
    "concrete_shape",
    "decode_text",
    "eval_dim_expr",
    "load_catalogue",
    "load_manifest",
    "random_inputs",
    "reference",
    "to_float64",
    "to_storage",
]
