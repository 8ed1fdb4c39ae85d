"""Issue 52: the pages around accounts and the job list, in Chromium at 1280 and 390 px: the
home list with its search, archive and "vs best baseline" column, the Team page and an
invitation from the link to a new account, and the password reset from the login page to the
new password. Each page must fit a phone's screen; screenshots go to test-artifacts/walk/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.core import mail

from portal.demo_example import demo_example_create
from tests.browser.conftest import (  # noqa: F401 - fixtures of the browser tests
    CHROMIUM,
    _orm_beside_playwright,
    browser,
    log_in,
    new_page,
)
from tests.portal.web.test_web_walk import shoot
from tests.portal.web.world import job_in_review, job_on_the_gpu

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing"),
]


@pytest.fixture
def world(orgs, customer, engineer, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    settings.GPU_DISPATCH = False
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    return {
        "example": demo_example_create(org=orgs[0], customer=customer, engineer=engineer),
        "review": job_in_review(orgs[0], customer, name="layernorm_rows"),
        "waiting": job_on_the_gpu(orgs[0], customer, name="rmsnorm_fused")[0],
    }


def test_the_job_list_searches_archives_and_compares_in_a_browser(
    live_server,
    new_page,  # noqa: F811 - the fixture imported above
    world,
):
    base = live_server.url
    page = new_page()
    log_in(page, base, "alice", "alice-pass")
    shoot(page, "20-home-jobs")
    # the recorded example was timed against baselines in its own run: a ratio, not a dash
    example_row = page.locator("#jobs tr", has=page.locator("text=softmax_example"))
    assert re.search(r"\d+\.\d\dx", example_row.locator(".vs-baseline").inner_text())
    page.fill("#id_q", "rmsnorm")
    page.click("#job-search button[type=submit]")
    page.wait_for_load_state("networkidle")
    rows = page.locator("#jobs tbody tr")
    assert rows.count() == 1 and "rmsnorm_fused" in rows.inner_text()
    shoot(page, "21-home-search")

    page.goto(f"{base}/")
    row = page.locator("#jobs tr", has=page.locator("text=layernorm_rows"))
    row.locator("td.hide-narrow button:has-text('Archive')").click()
    page.wait_for_load_state("networkidle")
    assert "archived" in page.locator(".messages").inner_text()
    assert page.locator("#jobs tr", has=page.locator("text=layernorm_rows")).count() == 0
    page.select_option("#id_show", "archived")
    page.click("#job-search button[type=submit]")
    page.wait_for_load_state("networkidle")
    shoot(page, "22-home-archived")
    # on a phone the Archive and Restore buttons sit under the job's name
    page.set_viewport_size({"width": 390, "height": 900})
    restore = page.locator("#jobs tr", has=page.locator("text=layernorm_rows")).locator(
        "form.only-narrow button:has-text('Restore')"
    )
    assert restore.is_visible()
    restore.click()
    page.wait_for_load_state("networkidle")
    assert "back on the job list" in page.locator(".messages").inner_text()


def test_an_invitation_from_the_team_page_to_a_new_account_in_a_browser(
    live_server,
    new_page,  # noqa: F811
    world,
    engineer,
):
    base = live_server.url
    engineer.is_staff = True
    engineer.save()
    page = new_page()
    log_in(page, base, "erin", "erin-pass")
    page.click("header nav >> text=Team")
    page.wait_for_url(f"{base}/team/")
    shoot(page, "23-team")
    page.fill("#id_email", "grace@acme.example")
    page.click("#invite")
    page.wait_for_selector("#fresh-link")
    shoot(page, "24-team-invited")
    (message,) = mail.outbox
    link = re.search(r"https?://\S+/invitations/\S+/", message.body).group(0)
    assert link in page.locator("#fresh-link").inner_text()

    stranger = new_page()
    stranger.goto(link)
    shoot(stranger, "25-invitation")
    stranger.fill("#id_username", "grace")
    stranger.fill("#id_password1", "grace-long-pass-52")
    stranger.fill("#id_password2", "grace-long-pass-52")
    stranger.click("#accept")
    stranger.wait_for_url(f"{base}/")
    assert "Welcome to Acme" in stranger.locator(".messages").inner_text()
    assert "softmax_example" in stranger.locator("#jobs").inner_text()
    shoot(stranger, "26-home-after-joining")
    stranger.goto(link)
    assert "used already" in stranger.locator("#link-state").inner_text()
    shoot(stranger, "27-invitation-used")


def test_a_password_reset_from_the_login_page_in_a_browser(
    live_server,
    new_page,  # noqa: F811
    world,
    customer,
):
    base = live_server.url
    customer.email = "alice@acme.example"
    customer.save()
    page = new_page()
    page.goto(f"{base}/accounts/login/")
    page.click("#forgot")
    shoot(page, "28-password-reset")
    page.fill("#id_email", "alice@acme.example")
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/accounts/password-reset/sent/")
    shoot(page, "29-password-reset-sent")
    (message,) = mail.outbox
    link = re.search(r"https?://\S+/accounts/password-reset/\S+/", message.body).group(0)
    page.goto(link)
    shoot(page, "30-password-new")
    page.fill("#id_new_password1", "alice-new-pass-52")
    page.fill("#id_new_password2", "alice-new-pass-52")
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/accounts/password-reset/done/")
    shoot(page, "31-password-set")
    log_in(page, base, "alice", "alice-new-pass-52")
