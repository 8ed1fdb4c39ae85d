"""Counts on the pages read as English: one generation, two generations."""

from __future__ import annotations

import pytest

from portal import services
from portal.models import Generation


@pytest.mark.parametrize(
    ("budget", "reason"),
    [(1, "budget: 1 generation"), (2, "budget: 2 generations"), (5, "budget: 5 generations")],
)
def test_the_budget_stop_reason_counts_generations_in_the_right_number(acme_world, budget, reason):
    job = acme_world["job"]
    job.max_generations = budget
    job.save(update_fields=["max_generations"])
    last = Generation.objects.create(job=job, index=budget - 1) if budget > 1 else None
    generation = last or job.generations.get(index=0)

    assert services.job_should_stop(job=job, generation=generation) == reason


@pytest.mark.parametrize(("days", "text"), [(1, "for 1 day:"), (7, "for 7 days:")])
def test_the_team_page_gives_the_invitation_lifetime_in_the_right_number(
    client, engineer, monkeypatch, days, text
):
    from django.urls import reverse

    from portal import accounts

    monkeypatch.setattr(accounts, "INVITATION_DAYS", days)
    client.force_login(engineer)
    response = client.get(reverse("web-team"))

    assert response.status_code == 200
    assert text in response.content.decode()
