"""In a real browser: a customer stops a running job's search early (after saying no once to
the confirmation), and cancels another job. Screenshot of a job page with its controls."""

import pytest

from portal.models import Job
from tests.browser.conftest import log_in
from tests.portal.conftest import make_world_for
from tests.portal.web.world import job_between_generations, job_in_review

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_customer_stops_one_job_early_and_cancels_another(
    live_server, new_page, artifacts_dir, orgs, customer, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path / "media"
    timed = job_between_generations(job_in_review(orgs[0], customer))
    fresh = make_world_for(orgs[0], customer, "acme-rmsnorm")["job"]
    base = live_server.url
    page = new_page()
    log_in(page, base, "alice", "alice-pass")

    page.goto(f"{base}/jobs/{timed.code}/")
    page.wait_for_selector("#stop")
    page.screenshot(path=str(artifacts_dir / "job_controls.png"), full_page=True)
    posts = []
    page.on("request", lambda request: request.method == "POST" and posts.append(request.url))
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.click("#stop")  # returns once the dialog is answered and any submit has started
    assert posts == []  # a dismissed confirmation sends nothing
    timed.refresh_from_db()
    assert timed.status == Job.RUNNING

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#stop")
    # The page comes back in review (the flash message may be gone already: a progress poll
    # that saw the job stop reloads the page once).
    page.wait_for_selector("#progress[data-status=review]")
    assert "stopped early by alice" in page.locator("#progress").inner_text()
    timed.refresh_from_db()
    assert timed.status == Job.REVIEW and timed.stop_reason == "stopped early by alice"
    assert page.locator("#stop").count() == 0 and page.locator("#cancel").count() == 0

    page.goto(f"{base}/jobs/{fresh.code}/")
    assert page.locator("#stop").count() == 0  # nothing has passed verification yet
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#cancel")
    page.wait_for_selector("#progress[data-status=cancelled]")
    assert "cancelled by alice" in page.locator("#progress").inner_text()
    fresh.refresh_from_db()
    assert fresh.status == Job.CANCELLED
