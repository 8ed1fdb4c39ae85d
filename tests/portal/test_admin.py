"""Staff manage everything through the Django admin; every registered model's pages open."""

import pytest
from django.contrib import admin
from django.urls import reverse

PORTAL_MODELS = [m for m in admin.site._registry if m._meta.app_label == "portal"]


def test_every_pipeline_model_is_in_the_admin():
    names = {m.__name__ for m in PORTAL_MODELS}
    assert {
        "Organisation",
        "Membership",
        "Workload",
        "Job",
        "Generation",
        "Candidate",
        "GpuBatch",
        "Environment",
        "VerificationResult",
        "TimingResult",
        "Baseline",
        "BaselineMeasurement",
        "Flag",
        "ReviewDecision",
        "Artifact",
        "AuditEvent",
        "ApiToken",
    } <= names


@pytest.mark.parametrize("model", PORTAL_MODELS, ids=lambda m: m.__name__)
def test_a_staff_engineer_opens_the_list_and_the_first_object(client, engineer, acme_world, model):
    engineer.is_superuser = True
    engineer.save()
    client.force_login(engineer)
    meta = model._meta
    response = client.get(reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist"))
    assert response.status_code == 200
    first = model.objects.first()
    if first is not None:
        url = reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[first.pk])
        assert client.get(url).status_code == 200


def test_a_customer_cannot_open_the_admin(client, customer):
    client.force_login(customer)
    response = client.get(reverse("admin:portal_job_changelist"))
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
