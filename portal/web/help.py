"""What the help pages say: the manifest and PyTorch references (our docs, rendered), the gallery
of examples, and the meaning of every verdict, chart and schedule label."""

from __future__ import annotations

import tomllib
from functools import lru_cache
from pathlib import Path

from django.urls import reverse

from portal.web import markdown

ROOT = Path(__file__).resolve().parents[2]
DOCS = {"manifest": ROOT / "docs" / "MANIFEST.md", "pytorch": ROOT / "docs" / "PYTORCH.md"}
EXAMPLES = ROOT / "factory" / "examples"


def doc_html(name: str) -> str:
    """docs/<NAME>.md as HTML, its links to the other rendered doc pointing at our page."""
    links = {p.name: reverse("web-help-doc", args=[n]) for n, p in DOCS.items()}
    return markdown.render(DOCS[name].read_text(), links=links)


@lru_cache(maxsize=1)
def examples() -> dict[str, dict]:
    """factory/examples/*.toml by file stem: name, description, and the kernel file its
    [baseline] names (read beside it), if any."""
    out = {}
    for path in sorted(EXAMPLES.glob("*.toml")):
        text = path.read_text()
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            continue
        kernel = None
        file = (data.get("baseline") or {}).get("file")
        if file and (EXAMPLES / file).is_file() and "/" not in file:
            kernel = {"filename": file, "source": (EXAMPLES / file).read_text()}
        out[path.stem] = {
            "stem": path.stem,
            "name": data.get("name", path.stem),
            "description": data.get("description", ""),
            "manifest": text,
            "kernel": kernel,
        }
    return out


JOB_VERDICTS = [
    ("Queued", "The job waits for a worker to start its first generation."),
    ("Running", "Agents are writing kernels, or they are being compiled and checked."),
    (
        "Waiting for GPU",
        "A batch of compiled candidates is out to a GPU (or waits for one): each is run on fresh "
        "random inputs at your shapes and held-out shapes, then timed.",
    ),
    ("In review", "The search stopped; an engineer reviews the fastest verified kernel."),
    ("Approved", "An engineer approved the kernel: the artifact is ready to download."),
    ("Rejected", "An engineer rejected it; the comment says why. Nothing is delivered."),
    ("Failed", "The job stopped on an error before review; the page says where."),
    ("Cancelled", "Someone stopped the job for good; nothing goes to review."),
]

CANDIDATE_VERDICTS = [
    ("proposed", "Written by an agent, not yet compiled."),
    (
        "rejected",
        "Refused before any GPU time: it did not compile, or a static check (bounds, barriers, "
        "the entry's parameters) or the reviewing agent refused it.",
    ),
    ("compiled", "Compiled and passed the static checks; waits for a GPU batch."),
    ("queued", "In a GPU batch, not yet back."),
    (
        "passed",
        "Matched the reference at every shape and held-out shape within tolerance, and was timed.",
    ),
    ("failed", "Ran on the GPU but gave wrong results, crashed or ran out of time."),
]

CHARTS = [
    (
        "generations",
        "Generations",
        "Every candidate's time (geometric mean over your shapes) by the generation that made it; "
        "colour is its verdict. A falling lower edge is the search finding faster kernels.",
    ),
    (
        "costmodel",
        "Cost model",
        "The time the cost model predicted before the GPU against the time measured. Points near "
        "the diagonal mean the model ranks well (ρ is its rank correlation), so GPU time goes "
        "to promising kernels.",
    ),
    (
        "baselines",
        "Against the baselines",
        "The best kernel's time at each shape beside every baseline's (PyTorch eager, "
        "torch.compile, library kernels, your own kernel). Shorter bars are faster. Drawn only "
        "once a baseline has been measured.",
    ),
    (
        "bandwidth",
        "Memory bandwidth",
        "For memory-bound operators: bytes the operator must move divided by time, in TB/s, "
        "against the card's measured copy ceiling. Near the ceiling, little more speed is left. "
        "Drawn only when the timings carry the bytes moved.",
    ),
    (
        "throughput",
        "Tensor-core throughput",
        "For matrix products: TFLOP/s achieved against the card's dense peak, beside the "
        "baselines'.",
    ),
    (
        "correctness",
        "Correctness",
        "The relative error of the best kernel against the float64 reference at each shape, "
        "with the tolerance as a line: every point must sit below it.",
    ),
]


def schedule_legends() -> list[tuple[str, str]]:
    """Each operator family's schedule label, in its own words (`legend`)."""
    from factory import families

    out = []
    for name in families.names():
        legend = getattr(families.get(name), "legend", "") or ""
        if legend:
            out.append((name, legend))
    return out
