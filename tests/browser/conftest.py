"""Playwright driving Debian's Chromium (no browser download), against Django's live server.

Playwright's sync API runs an event loop in the test's thread, and Django refuses ORM calls from
a thread with a running loop unless told it is safe (the test thread only sets up data)."""

from __future__ import annotations

from pathlib import Path

import pytest

# The shared personas (a customer and an engineer of Acme, an outsider of Globex).
from tests.portal.conftest import (  # noqa: F401
    _fast_password_hashing,
    customer,
    engineer,
    orgs,
    outsider,
)

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def pytest_collection_modifyitems(config, items):
    if Path(CHROMIUM).exists():
        return
    skip = pytest.mark.skip(reason=f"{CHROMIUM} is missing (apt-get install -y chromium)")
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="module")
def _orm_beside_playwright():
    """Django may be called from the test thread while Playwright's loop runs, in the browser
    tests only: the setting is gone when they end, so it never reaches other tests (nor the
    processes they start, where `check --deploy` refuses it)."""
    patch = pytest.MonkeyPatch()
    patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    yield
    patch.undo()


@pytest.fixture(scope="module")
def browser():
    # One Chromium a module: Playwright's loop stops with it, before the next tests run.
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def new_page(browser):
    contexts = []

    def make():
        context = browser.new_context(
            viewport={"width": 1360, "height": 900}, accept_downloads=True
        )
        context.set_default_timeout(15_000)
        contexts.append(context)
        return context.new_page()

    yield make
    for context in contexts:
        context.close()


@pytest.fixture
def artifacts_dir():
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


def log_in(page, base_url: str, username: str, password: str) -> None:
    page.goto(f"{base_url}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base_url}/")
