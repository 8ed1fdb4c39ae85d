"""The upload form under hostile fields and files: a page with the errors, never a 500."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from hypothesis import given, settings
from hypothesis import strategies as st

from portal.models import Job
from tests.portal.fuzz.conftest import examples
from tests.portal.fuzz.strategies import printable_text
from tests.portal.fuzz.test_fuzz_api import MANIFEST

pytestmark = pytest.mark.django_db

manifest_texts = st.one_of(
    printable_text,
    st.just(MANIFEST),
    # the sample manifest with one line broken or replaced
    st.builds(
        lambda i, line: "\n".join(
            line if n == i else old for n, old in enumerate(MANIFEST.splitlines())
        ),
        st.integers(min_value=0, max_value=8),
        printable_text,
    ),
    st.integers(min_value=1, max_value=3000).map(lambda n: "a = " + "[" * n + "]" * n),
    st.integers(min_value=21, max_value=5000).map(lambda n: MANIFEST + "\nx = " + "9" * n),
)
files = st.one_of(
    st.none(),
    st.builds(
        lambda name, content: SimpleUploadedFile(name, content),
        st.sampled_from(
            ["m.toml", "k.cu", "k.ptx", "k.py", "../../etc/passwd", "\u202e.cu", "x" * 300]
        ),
        st.one_of(st.binary(max_size=300), manifest_texts.map(lambda t: t.encode("utf-8"))),
    ),
)
fields = st.fixed_dictionaries(
    {},
    optional={
        "mode": st.one_of(st.sampled_from(["manifest", "catalogue", ""]), printable_text),
        "manifest": manifest_texts,
        "operator": st.one_of(st.sampled_from(["softmax", "rmsnorm", ""]), printable_text),
        "shapes": st.one_of(st.sampled_from(["4096x4096", "1x1", "0x0", "9" * 40]), printable_text),
        "dtype": st.one_of(st.sampled_from(["bf16", "fp16", "fp32"]), printable_text),
        "generations": st.one_of(st.integers().map(str), st.just("9" * 5000), printable_text),
        "per_row_length": st.sampled_from(["on", "", "true", "0"]),
    },
)


@settings(settings.get_profile("ci"), max_examples=examples(300))
@given(data=fields, manifest_file=files, baseline=files)
def test_any_upload_is_answered_without_a_server_error(
    client, customer, data, manifest_file, baseline
):
    client.force_login(customer)
    post = dict(data)
    if manifest_file is not None:
        post["manifest_file"] = manifest_file
    if baseline is not None:
        post["baseline"] = baseline
    jobs = Job.objects.count()
    response = client.post(reverse("web-upload"), post)
    assert response.status_code < 500, response.content[:500]
    if response.status_code == 400:
        assert Job.objects.count() == jobs
