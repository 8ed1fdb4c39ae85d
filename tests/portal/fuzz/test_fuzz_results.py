"""The results import under hostile files: recorded whole or refused naming a field, never a
server error, and evidence unchanged on a refusal."""

import copy
import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import transaction
from django.urls import reverse
from hypothesis import given, settings
from hypothesis import strategies as st

from portal import results_schema, services
from tests.portal import test_results_record
from tests.portal.fuzz.conftest import examples
from tests.portal.fuzz.strategies import dumps, json_values, raw_bodies
from tests.portal.results_files import results_for
from tests.portal.test_hardening_results_schema import evidence

pytestmark = pytest.mark.django_db
dispatched = test_results_record.dispatched  # the fixture: two queued candidates out to a GPU


def paths(doc, prefix=()):
    """Every path into a results document (keys and list indexes)."""
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from paths(v, (*prefix, i))


def mutate(doc, path, value, delete):
    out = copy.deepcopy(doc)
    if not path:
        return value
    node = out
    for key in path[:-1]:
        node = node[key]
    if delete and isinstance(node, dict):
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


@settings(settings.get_profile("ci"), max_examples=examples(500))
@given(data=st.data(), value=json_values, delete=st.booleans())
def test_a_mutated_results_file_is_recorded_or_refused_and_never_breaks(
    dispatched, data, value, delete
):
    good = results_for(dispatched.batch)
    every = sorted(paths(good), key=repr)
    path = data.draw(st.sampled_from(every), label="path")
    results = mutate(good, path, value, delete)
    before = evidence()
    with transaction.atomic():
        try:
            services.results_record(results=results)
        except services.ResultsError as exc:
            assert str(exc)  # a sentence naming what is wrong
            assert evidence() == before
        transaction.set_rollback(True)


@settings(settings.get_profile("ci"), max_examples=examples(1000))
@given(text=raw_bodies)
def test_loading_any_text_is_a_value_or_a_schema_error(text):
    try:
        value = results_schema.loads(text.encode("utf-8", "surrogatepass"))
    except results_schema.SchemaError:
        return
    results_schema.problem(value)  # a sentence or None, never an exception


@settings(settings.get_profile("ci"), max_examples=examples(150))
@given(
    content=st.one_of(
        raw_bodies.map(lambda t: t.encode("utf-8", "surrogatepass")),
        json_values.map(lambda v: dumps({"format": 1, "batch_id": "BATCH", "candidates": v})),
        st.binary(max_size=200),
    )
)
def test_the_import_form_answers_any_file_without_a_server_error(
    client, engineer, dispatched, content
):
    if isinstance(content, str):
        content = content.replace("BATCH", str(dispatched.code)).encode("utf-8", "surrogatepass")
    client.force_login(engineer)
    before = evidence()
    response = client.post(
        reverse("web-job-import", args=[dispatched.job.code]),
        {"results": SimpleUploadedFile("results.json", content)},
    )
    assert response.status_code in (302, 400), response.status_code
    if response.status_code == 400:
        assert evidence() == before


def test_a_good_file_through_the_form_is_recorded(client, engineer, dispatched):
    client.force_login(engineer)
    content = json.dumps(results_for(dispatched.batch)).encode()
    response = client.post(
        reverse("web-job-import", args=[dispatched.job.code]),
        {"results": SimpleUploadedFile("results.json", content)},
    )
    assert response.status_code == 302
