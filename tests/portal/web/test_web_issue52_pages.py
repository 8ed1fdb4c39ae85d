"""Issue 52, the pages around a job: email promised only where it is sent, an account page to
give the address, a styled 404, a favicon, the compile report from the cache in full, and a
best kernel slower than its baseline said plainly."""

import pytest
from django.core import mail
from django.urls import reverse

from portal.delivery import decide_and_deliver
from portal.models import Candidate, TimingResult
from tests.portal.web.world import job_in_review

pytestmark = pytest.mark.django_db


@pytest.fixture
def review_job(orgs, customer, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    return job_in_review(orgs[0], customer)


def test_a_job_in_review_promises_email_only_to_a_customer_with_an_address(
    client, customer, review_job
):
    customer.email = ""
    customer.save()
    client.force_login(customer)
    page = client.get(reverse("web-job", args=[review_job.code])).content.decode()
    assert "is emailed to" not in page and "give an email address" in page
    assert reverse("web-profile") in page
    customer.email = "ada@example.com"
    customer.save()
    page = client.get(reverse("web-job", args=[review_job.code])).content.decode()
    assert "is emailed to <code>ada@example.com</code>" in page


def test_a_customer_sets_their_address_on_the_account_page_and_the_decision_is_emailed(
    client, customer, engineer, review_job, settings
):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    client.force_login(customer)
    assert client.get(reverse("web-profile")).status_code == 200
    ticked = {"on_review": "on", "on_decision": "on", "on_failure": "on"}
    response = client.post(
        reverse("web-profile"), {"form": "email", "email": "ada@example.com", **ticked}
    )
    assert response.status_code == 302
    customer.refresh_from_db()
    assert customer.email == "ada@example.com"
    bad = client.post(reverse("web-profile"), {"form": "email", "email": "not an address"})
    assert bad.status_code == 400
    decide_and_deliver(
        job=review_job, reviewer=engineer, decision="reject", comment="too slow", checklist={}
    )
    assert [m.to for m in mail.outbox] == [["ada@example.com"]]


def test_a_customer_changes_their_password_on_the_account_page(client, customer):
    customer.set_password("old-secret-1")
    customer.save()
    client.force_login(customer)
    response = client.post(
        reverse("web-profile"),
        {
            "form": "password",
            "old_password": "old-secret-1",
            "new_password1": "a-new-Secret-42",
            "new_password2": "a-new-Secret-42",
        },
    )
    assert response.status_code == 302
    customer.refresh_from_db()
    assert customer.check_password("a-new-Secret-42")


def test_a_missing_page_is_a_styled_404_with_the_navigation(client, customer, settings):
    settings.DEBUG = False
    client.force_login(customer)
    response = client.get("/jobs/00000000-0000-0000-0000-000000000000/")
    assert response.status_code == 404
    page = response.content.decode()
    assert 'id="not-found"' in page and "portal.css" in page and "Log out" in page


def test_every_page_links_a_favicon_and_favicon_ico_leads_to_it(client, customer):
    client.force_login(customer)
    page = client.get(reverse("web-home")).content.decode()
    assert 'rel="icon"' in page and "favicon.svg" in page
    response = client.get("/favicon.ico")
    assert response.status_code == 301 and response["Location"].endswith("favicon.svg")


def test_the_navigation_wraps_at_a_phones_width_so_log_out_stays_visible(client):
    from django.contrib.staticfiles import finders

    css = open(finders.find("css/portal.css")).read()
    narrow = css.split("@media (max-width: 640px)", 1)[1].split("\n}\n", 1)[0]
    assert "flex-wrap: wrap" in narrow and ".topbar nav" in narrow


def test_the_compile_report_from_the_cache_is_shown_whole_on_its_own_row(
    client, customer, review_job
):
    best = review_job.best_candidate
    Candidate.objects.filter(pk=best.pk).update(
        compile_report={**best.compile_report, "compile_ms": 61.25, "cached": True}
    )
    client.force_login(customer)
    page = client.get(reverse("web-candidate", args=[best.code])).content.decode()
    row = page.split('id="compile-cached"', 1)[1].split("</tr>", 1)[0]
    assert 'class="wrap"' in row and "compile cache" in row
    assert "61.2 ms</td>" in page


def test_a_best_kernel_slower_than_the_baseline_is_said_plainly(client, customer, review_job):
    best = review_job.best_candidate
    # Make the kernel slower than every baseline: 0.5x.
    for t in TimingResult.objects.filter(candidate=best):
        TimingResult.objects.filter(pk=t.pk).update(median_us=t.median_us * 4)
    Candidate.objects.filter(pk=best.pk).update(score_us=best.score_us * 4)
    client.force_login(customer)
    page = client.get(reverse("web-job", args=[review_job.code])).content.decode()
    assert "slower than" in page
    assert 'class="speed slower"' in page


def test_a_server_error_page_is_styled_and_names_its_request_id(rf):
    from portal.middleware import server_error

    request = rf.get("/jobs/")
    request.correlation_id = "abc123"
    response = server_error(request)
    page = response.content.decode()
    assert response.status_code == 500
    assert "css/portal.css" in page and "id='server-error'" in page and "abc123" in page


def test_the_owner_is_emailed_when_a_job_goes_to_review_and_when_one_fails(
    orgs, customer, settings, tmp_path, django_capture_on_commit_callbacks
):
    from portal import services
    from portal.models import Job
    from tests.portal.web.world import job_on_the_gpu

    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.MEDIA_ROOT = tmp_path / "media"
    customer.email = "ada@example.com"
    customer.save()
    with django_capture_on_commit_callbacks(execute=True):
        job_in_review(orgs[0], customer)
    assert [m.subject for m in mail.outbox][-1].endswith(
        "the search is done, an engineer reviews it"
    )
    job, _ = job_on_the_gpu(orgs[0], customer, name="other")
    with django_capture_on_commit_callbacks(execute=True):
        assert services.job_fail(job=job, reason="the agents cannot run")
    assert mail.outbox[-1].subject.endswith("the job failed")
    assert "the agents cannot run" in mail.outbox[-1].body and mail.outbox[-1].to == [
        customer.email
    ]
    assert Job.objects.get(pk=job.pk).status == Job.FAILED


def test_a_customer_who_turns_off_decision_emails_gets_none(
    client, customer, engineer, review_job, settings
):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    client.force_login(customer)
    page = client.get(reverse("web-profile")).content.decode()
    assert "When an engineer approves or rejects" in page
    response = client.post(
        reverse("web-profile"),
        {"form": "email", "email": "ada@example.com", "on_review": "on", "on_failure": "on"},
    )
    assert response.status_code == 302
    decide_and_deliver(
        job=review_job, reviewer=engineer, decision="reject", comment="too slow", checklist={}
    )
    assert mail.outbox == []
