"""Storing an agent's draft keeps the cost model's prediction (a finite one) with the candidate."""

import pytest

from portal import services
from portal.models import Generation
from tests.portal.web.world import SIMPLE_PTX, job_in_review

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("predicted", "stored"), [(12.5, 12.5), (float("inf"), None), (None, None)]
)
def test_a_drafts_predicted_time_is_stored_when_finite(orgs, customer, predicted, stored):
    job = job_in_review(orgs[0], customer, candidates=1)
    generation = Generation.objects.create(job=job, index=1)
    ptx = SIMPLE_PTX.replace("//", "// another", 1)
    draft = {"ptx": ptx, "entry": "copy_k", "role": "writer", "predicted_us": predicted}
    candidate = services.candidate_from_draft(job=job, generation=generation, draft=draft)
    assert candidate is not None and candidate.predicted_us == stored
