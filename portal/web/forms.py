"""Forms for the pages: the workload upload and the review decision.

The upload form checks what can be checked without the spec (sizes, encodings, extensions,
NUL bytes) and then hands the text to `factory.spec.load_manifest` through the service; a
SpecError's (field, problem) pairs come back here and are attached to the form field they
concern, so the customer sees each problem next to what caused it.
"""

from __future__ import annotations

import re

from django import forms
from django.conf import settings
from django.core import signing
from django.core.validators import ProhibitNullCharactersValidator

from portal.uploads import (
    BASELINE_EXTENSIONS,
    BASELINE_MAX_BYTES,
    MANIFEST_MAX_BYTES,
    check_text,
    decode_text,
)

DTYPE_CHOICES = [("fp32", "fp32"), ("bf16", "bf16"), ("fp16", "fp16")]
MAX_SHAPES = 16
# A kernel file kept across a validation error rides in a signed hidden field: browsers do not
# refill a file input, and the customer should not have to choose the file again.
KEPT_SALT = "portal.upload.kept-baseline"
KEPT_MAX_AGE_S = 24 * 3600


def target_choices() -> list[tuple[str, str]]:
    """The GPU architectures the factory emits for, each with the card it means."""
    from factory.device import device_for
    from factory.spec.manifest import TARGETS

    return [(t, f"{t}: {device_for(t).name}") for t in TARGETS]


def parse_shapes(text: str) -> list[dict[str, int]]:
    """``M=4096 N=4096; M=1 N=1000`` (shapes separated by ';' or new lines, dims by spaces or
    commas) to a list of dicts, or a ValidationError naming the piece that is wrong."""
    shapes = []
    for n, chunk in enumerate(re.split(r"[;\n]+", text.strip()), start=1):
        chunk = chunk.strip()
        if not chunk:
            continue
        dims: dict[str, int] = {}
        for part in re.split(r"[\s,]+", chunk):
            name, eq, value = part.partition("=")
            if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,15}", name):
                raise forms.ValidationError(f"Shape {n}: {part!r} is not of the form NAME=SIZE.")
            if not re.fullmatch(r"[0-9]{1,10}", value) or int(value) < 1:
                raise forms.ValidationError(
                    f"Shape {n}: {name} must be a positive whole number, not {value!r}."
                )
            dims[name] = int(value)
        shapes.append(dims)
    if not shapes:
        raise forms.ValidationError("Give at least one shape, e.g. M=4096 N=4096.")
    if len(shapes) > MAX_SHAPES:
        raise forms.ValidationError(f"At most {MAX_SHAPES} shapes, not {len(shapes)}.")
    return shapes


class UploadForm(forms.Form):
    MODE_MANIFEST = "manifest"
    MODE_CATALOGUE = "catalogue"

    mode = forms.ChoiceField(
        choices=[(MODE_MANIFEST, "Your manifest"), (MODE_CATALOGUE, "Pick from the catalogue")],
        initial=MODE_MANIFEST,
        widget=forms.RadioSelect,
    )
    manifest = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"spellcheck": "false", "rows": 12, "class": "manifest"}),
        help_text="TOML: inputs, outputs as expressions, shapes, dtypes, tolerance, target.",
    )
    manifest_file = forms.FileField(
        required=False,
        help_text="The file that ptxf import wrote from your PyTorch code, or any manifest "
        "(up to 64 KiB).",
    )
    operator = forms.ChoiceField(required=False, choices=[])
    shapes = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "class": "short"}),
        help_text="One shape per line, e.g. M=16384 N=4096. Left blank: the operator's own "
        "shapes from the catalogue.",
    )
    dtype = forms.ChoiceField(required=False, choices=DTYPE_CHOICES, initial="bf16")
    target = forms.ChoiceField(
        required=False,
        choices=[],
        initial="sm_90",
        help_text="The GPU the kernel is written, verified and timed for.",
    )
    kept_baseline = forms.CharField(required=False, widget=forms.HiddenInput)
    baseline = forms.FileField(
        required=False,
        help_text="Optional: your current kernel (.ptx, or CUDA C .cu), up to 512 KiB. It is a "
        "baseline to beat and a starting point.",
    )
    generations = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=50,
        help_text="How many generations the search may run (1 to 50); it stops early on a plateau.",
    )
    per_row_length = forms.BooleanField(
        required=False,
        label="A kernel per row length",
        help_text="Where your shapes have rows of several lengths, a workload and a job for each "
        "length: the fastest kernel at each. Unticked, one kernel serves every shape.",
    )

    def __init__(self, *args, catalogue_names: list[str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        names = catalogue_names or []
        self.fields["generations"].widget.attrs["placeholder"] = (
            f"default: {settings.FACTORY_GENERATIONS}"
        )
        # Django refuses NUL characters in text fields with a terse message; say what it means.
        for name, what in (("manifest", "manifest"), ("shapes", "shape list")):
            self.fields[name].validators = [
                ProhibitNullCharactersValidator(
                    message=f"The {what} contains NUL bytes: it looks like a binary file."
                )
            ]
        self.fields["operator"].choices = [("", "— choose an operator —")] + [(n, n) for n in names]
        self.fields["target"].choices = target_choices()

    def clean_kept_baseline(self):
        value = self.cleaned_data.get("kept_baseline") or ""
        if not value:
            return None
        try:
            kept = signing.loads(value, salt=KEPT_SALT, max_age=KEPT_MAX_AGE_S)
        except signing.BadSignature:
            raise forms.ValidationError(
                "The kernel file kept from your last try could not be read back; choose it again."
            ) from None
        return {"filename": str(kept["filename"]), "source": str(kept["source"])}

    @staticmethod
    def sign_kept(baseline: dict) -> str:
        return signing.dumps(baseline, salt=KEPT_SALT, compress=True)

    def keep_for_retry(self) -> None:
        """After an error, put what was uploaded back into the form it re-renders: a manifest
        file's text goes into the text box, a kernel file into the signed hidden field."""
        data = self.data.copy()
        cleaned = getattr(self, "cleaned_data", {}) or {}
        # (add_error drops a field's cleaned value; the text clean() chose is still there)
        from_file = cleaned.get("manifest_file") or (
            cleaned.get("manifest_text") if self.files.get("manifest_file") else None
        )
        if from_file:
            data["manifest"] = from_file
        baseline = cleaned.get("baseline")
        if baseline:
            data["kept_baseline"] = self.sign_kept(baseline)
        self.data = data
        self._bound_fields_cache.clear()  # bound fields read the data once: read it again

    def kept_baseline_name(self) -> str:
        source = self.data if self.is_bound else self.initial
        value = source.get("kept_baseline")
        if not value:
            return ""
        try:
            return str(signing.loads(value, salt=KEPT_SALT, max_age=KEPT_MAX_AGE_S)["filename"])
        except (signing.BadSignature, KeyError, TypeError):
            return ""

    def clean_manifest_file(self):
        upload = self.cleaned_data.get("manifest_file")
        if not upload:
            return None
        name = upload.name or ""
        if not name.lower().endswith(".toml"):
            raise forms.ValidationError(f"{name!r}: a manifest file must end in .toml.")
        if upload.size > MANIFEST_MAX_BYTES:
            raise forms.ValidationError(
                f"The manifest file is {upload.size:,} bytes; the limit is "
                f"{MANIFEST_MAX_BYTES:,} bytes."
            )
        return decode_text(upload.read(), what="manifest file", max_bytes=MANIFEST_MAX_BYTES)

    def clean_manifest(self):
        text = self.cleaned_data.get("manifest") or ""
        if len(text.encode()) > MANIFEST_MAX_BYTES:
            raise forms.ValidationError(
                f"The manifest is {len(text.encode()):,} bytes; the limit is "
                f"{MANIFEST_MAX_BYTES:,} bytes."
            )
        return check_text(text, what="manifest") if text.strip() else ""

    def clean_baseline(self):
        upload = self.cleaned_data.get("baseline")
        if not upload:
            return None
        name = (upload.name or "").rsplit("/", 1)[-1]
        ext = "." + name.rsplit(".", 1)[-1].lower() if "." in name else ""
        if ext not in BASELINE_EXTENSIONS:
            raise forms.ValidationError(
                f"{name!r}: the kernel must be PTX (.ptx) or CUDA C (.cu), "
                f"not {ext or 'a file without an extension'}."
            )
        if upload.size > BASELINE_MAX_BYTES:
            raise forms.ValidationError(
                f"The kernel file is {upload.size:,} bytes; the limit is "
                f"{BASELINE_MAX_BYTES:,} bytes."
            )
        text = decode_text(upload.read(), what="kernel file", max_bytes=BASELINE_MAX_BYTES)
        return {"filename": name, "source": text}

    def clean_shapes(self):
        text = self.cleaned_data.get("shapes") or ""
        if self.data.get("mode") != self.MODE_CATALOGUE:
            return None
        if not text.strip():
            return []  # the catalogue operator's own shapes (and held-out shapes)
        return parse_shapes(text)

    def clean(self):
        data = super().clean()
        if not data.get("baseline") and data.get("kept_baseline"):
            data["baseline"] = data["kept_baseline"]
        mode = data.get("mode")
        if mode == self.MODE_CATALOGUE:
            if not data.get("operator"):
                self.add_error("operator", "Choose an operator from the catalogue.")
        elif mode == self.MODE_MANIFEST:
            text = data.get("manifest_file") or data.get("manifest")
            if not text and "manifest" not in self.errors and "manifest_file" not in self.errors:
                self.add_error("manifest", "Write a manifest or upload a .toml file.")
            data["manifest_text"] = text
        return data

    def add_spec_errors(self, errors: list[tuple[str, str]]) -> None:
        """Attach each SpecError (field path, problem) to the form field it concerns."""
        for path, problem in errors:
            self.add_error(
                self.field_for_spec_path(path), f"{path}: {problem}" if path else problem
            )

    def field_for_spec_path(self, path: str) -> str:
        head = re.split(r"[.\[]", path or "", maxsplit=1)[0]
        if head in ("baseline", "kernel", "baseline_source", "baseline_filename"):
            return "baseline"
        if self.cleaned_data.get("mode") == self.MODE_CATALOGUE:
            if head in ("shapes", "heldout_shapes", "dims"):
                return "shapes"
            if path.endswith(".dtype") or head == "dtype":
                return "dtype"
            return "operator"
        return "manifest_file" if self.cleaned_data.get("manifest_file") else "manifest"


class ReviewForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")])
    comment = forms.CharField(
        required=False,
        max_length=4000,
        widget=forms.Textarea(attrs={"rows": 4, "class": "short"}),
        help_text="What you checked and why you decided. The customer sees this.",
    )
    baseline = forms.CharField(required=False, max_length=64)
    override = forms.BooleanField(
        required=False,
        label="Approve although a check fails (explain in the comment)",
    )

    def clean(self):
        data = super().clean()
        if data.get("decision") == "reject" and not (data.get("comment") or "").strip():
            self.add_error("comment", "Say why it is rejected: the customer reads this.")
        if data.get("override") and not (data.get("comment") or "").strip():
            self.add_error("comment", "An override needs a comment explaining it.")
        return data


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, required=False)


class RerunForm(forms.Form):
    """Another job on a stored workload: only its budget is asked for."""

    generations = forms.IntegerField(required=False, min_value=1, max_value=50)


class EmailForm(forms.Form):
    """Where decisions on the user's jobs are emailed; blank: nowhere (the job page only)."""

    email = forms.EmailField(required=False, max_length=254)
    on_review = forms.BooleanField(required=False, label="When a job is done and waits for review")
    on_decision = forms.BooleanField(required=False, label="When an engineer approves or rejects")
    on_failure = forms.BooleanField(required=False, label="When a job fails")
