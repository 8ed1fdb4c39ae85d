"""The API under hostile requests: never a 500, never HTML (issue 51)."""

import uuid
from urllib.parse import quote

import pytest
from django.urls import reverse
from hypothesis import given, settings
from hypothesis import strategies as st

from portal import services
from portal.models import Job
from tests.portal.fuzz.conftest import examples
from tests.portal.fuzz.strategies import dumps, hostile_text, json_values, raw_bodies

pytestmark = pytest.mark.django_db

MANIFEST = """name = "fuzz_copy"
[dims]
N = [1024]
[inputs]
x = { dtype = "fp32", shape = ["N"] }
[outputs]
y = { dtype = "fp32", shape = ["N"], expr = "x" }
"""


@pytest.fixture
def auth(customer):
    key, _ = services.api_token_create(user=customer, name="fuzz")
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


@pytest.fixture
def a_job(orgs, customer):
    from tests.portal.conftest import make_world_for

    return make_world_for(orgs[0], customer, "fuzzed")["job"]


def check(response):
    assert response.status_code < 500, response.content[:500]
    kind = response.get("Content-Type", "")
    if response.status_code >= 300 or response.status_code == 200 and "zip" not in kind:
        assert kind.startswith("application/json"), (response.status_code, kind)
    if response.status_code >= 400 and response.content:  # (a HEAD answer has no body)
        body = response.json()
        assert body["error"] and body["status"] == response.status_code


submit_bodies = st.fixed_dictionaries(
    {},
    optional={
        "manifest": st.one_of(hostile_text, st.just(MANIFEST), json_values),
        "generations": json_values,
        "per_row_length": json_values,
        "baseline_source": st.one_of(hostile_text, json_values),
        "baseline_filename": st.one_of(st.sampled_from(["k.cu", "k.ptx", "../x"]), hostile_text),
    },
)


@settings(settings.get_profile("ci"), max_examples=examples(400))
@given(body=st.one_of(submit_bodies.map(dumps), raw_bodies))
def test_submitting_any_body_is_never_a_500(client, auth, body):
    with_jobs = Job.objects.count()
    response = client.generic(
        "POST",
        reverse("api-jobs"),
        body.encode("utf-8", "surrogatepass"),
        "application/json",
        **auth,
    )
    check(response)
    if response.status_code != 201:
        assert Job.objects.count() == with_jobs


content_types = st.sampled_from(
    ["application/json", "text/plain", "application/x-www-form-urlencoded", "", "multipart/x"]
)


@settings(settings.get_profile("ci"), max_examples=examples(300))
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]),
    tail=st.sampled_from(["", "results/", "cancel/", "stop/", "artifact/", "jobs/", "x/"]),
    kind=st.sampled_from(["jobs", "workloads", "candidates", "nothing"]),
    ident=st.one_of(st.uuids().map(str), st.just("JOB"), hostile_text),
    body=raw_bodies,
    content_type=content_types,
    with_token=st.booleans(),
)
def test_any_method_on_any_api_path_is_json_and_never_a_500(
    client, auth, a_job, method, tail, kind, ident, body, content_type, with_token
):
    ident = str(a_job.code) if ident == "JOB" else ident
    path = f"/api/v1/{kind}/{quote(ident.encode('utf-8', 'surrogatepass'), safe='')}/{tail}"
    response = client.generic(
        method,
        path,
        body.encode("utf-8", "surrogatepass"),
        content_type,
        **(auth if with_token else {}),
    )
    check(response)


@settings(settings.get_profile("ci"), max_examples=examples(200))
@given(
    header=st.one_of(
        st.just(""),
        st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=80),
        st.builds(lambda t: "Bearer ptxf_" + t, st.text(min_size=0, max_size=60)),
    )
)
def test_any_authorization_header_is_a_json_401_or_an_answer(client, header):
    header = header.encode("utf-8", "surrogatepass").decode("latin-1")
    response = client.get(reverse("api-jobs"), HTTP_AUTHORIZATION=header)
    check(response)


def test_the_jobs_of_another_organisation_stay_404(client, auth, orgs, outsider):
    from tests.portal.conftest import make_world_for

    theirs = make_world_for(orgs[1], outsider, "theirs")["job"]
    response = client.get(reverse("api-job", args=[theirs.code]), **auth)
    assert response.status_code == 404 and response.json()["status"] == 404
    assert client.get(reverse("api-job", args=[uuid.uuid4()]), **auth).status_code == 404
