"""Every page in a real browser at a desktop width (1280 px) and a phone's (390 px): nothing
wider than the screen, "Log out" on screen, and a full-page screenshot of each kept under
tests/browser/screenshots/ (git-ignored) for a person to look at."""

from pathlib import Path

import pytest

from portal.demo_example import demo_example_create
from tests.browser.conftest import log_in
from tests.portal.web.world import job_in_review, job_on_the_gpu

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHOTS = Path(__file__).resolve().parent / "screenshots"
WIDTHS = (1280, 390)


def _check_and_shoot(page, name: str, width: int) -> None:
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 1, f"{name} at {width} px is {overflow} px wider than the screen"
    logout = page.locator("header.topbar button:has-text('Log out')")
    if logout.count():
        box = logout.bounding_box()
        assert box and box["x"] + box["width"] <= width, f"Log out cut off on {name} at {width}"
    page.screenshot(path=str(SHOTS / f"{name}-{width}.png"), full_page=True)
    # A tall page at a phone's width is also kept in screen-high parts, readable one by one.
    height = page.evaluate("document.documentElement.scrollHeight")
    if width < 600 and height > 1600:
        for i, top in enumerate(range(0, height, 1200)):
            clip = {"x": 0, "y": top, "width": width, "height": min(1200, height - top)}
            part = SHOTS / f"{name}-{width}-part{i}.png"
            page.screenshot(path=str(part), clip=clip, full_page=True)


def test_every_page_fits_a_desktop_and_a_phone_and_is_photographed(
    live_server, browser, orgs, customer, engineer, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path / "media"
    settings.GPU_DISPATCH = False
    SHOTS.mkdir(exist_ok=True)
    example = demo_example_create(org=orgs[0], customer=customer, engineer=engineer)
    review = job_in_review(orgs[0], customer, name="layernorm")
    waiting, _ = job_on_the_gpu(orgs[0], customer, name="rmsnorm", candidates=8)
    best = example.best_candidate
    base = live_server.url
    customer_pages = {
        "home": "/",
        "upload": "/workloads/new/",
        "upload-example": "/workloads/new/?example=softmax_ptx",
        "workload": f"/workloads/{example.workload.code}/",
        "job-example": f"/jobs/{example.code}/",
        "job-waiting": f"/jobs/{waiting.code}/",
        "candidate": f"/candidates/{best.code}/",
        "help": "/help/",
        "help-manifest": "/help/manifest/",
        "help-pytorch": "/help/pytorch/",
        "help-examples": "/help/examples/",
        "account": "/account/",
        "tokens": "/tokens/",
        "not-found": "/jobs/00000000-0000-0000-0000-000000000000/",
    }
    engineer_pages = {
        "engineer-home": "/",
        "review-queue": "/review/",
        "review": f"/review/{review.code}/",
        "evidence": "/evidence/",
    }
    for width in WIDTHS:
        context = browser.new_context(viewport={"width": width, "height": 900})
        context.set_default_timeout(15_000)
        page = context.new_page()
        page.goto(f"{base}/accounts/login/")
        _check_and_shoot(page, "login", width)
        log_in(page, base, "alice", "alice-pass")
        for name, path in customer_pages.items():
            page.goto(base + path)
            page.wait_for_load_state("networkidle")
            _check_and_shoot(page, name, width)
        context.close()
        context = browser.new_context(viewport={"width": width, "height": 900})
        page = context.new_page()
        log_in(page, base, "erin", "erin-pass")
        for name, path in engineer_pages.items():
            page.goto(base + path)
            page.wait_for_load_state("networkidle")
            _check_and_shoot(page, name, width)
        context.close()
