"""At a phone's width (390 px) the Team page wraps a long email address at its "@" and its dots
(or after a hyphen), not in the middle of a word, and the tables stay inside their cards. The
page is rendered by Django and laid out by Chromium with our stylesheet."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.urls import reverse

from portal import accounts
from tests.browser.conftest import (  # noqa: F401 - fixtures of the browser tests
    CHROMIUM,
    _orm_beside_playwright,
    browser,
)

CSS = Path(__file__).resolve().parents[2] / "static" / "css" / "portal.css"

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing"),
]

EMAILS = [
    "grace@acme.example",
    "margaret.hamilton-smith@research.acme-industries.example",
    "christopher.montgomery@laboratories.example.co.uk",
]

# The rendered lines of each address on the Invitations card, and whether a card scrolls.
LINES = """() => {
    const cells = document.querySelectorAll("#invitations tbody tr td:first-child");
    const lines = [...cells].map((el) => {
        // the address: the cell's text less the role written under it
        const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT, {
            acceptNode: (n) => n.parentElement.closest(".small")
                ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT,
        });
        const out = [];
        let top = null;
        for (let node = walker.nextNode(); node; node = walker.nextNode()) {
            for (let i = 0; i < node.length; i++) {
                const range = document.createRange();
                range.setStart(node, i);
                range.setEnd(node, i + 1);
                const y = range.getBoundingClientRect().top;
                if (top === null || y > top + 2) { out.push(""); top = y; }
                out[out.length - 1] += node.data[i];
            }
        }
        return out;
    });
    const scrolls = [...document.querySelectorAll(".card")]
        .filter((c) => c.scrollWidth > c.clientWidth + 1).map((c) => c.id);
    return {lines, scrolls, overflow: document.documentElement.scrollWidth - innerWidth};
}"""


def _team_page(client, engineer, orgs) -> str:
    for email in EMAILS:
        accounts.invitation_create(user=engineer, org=orgs[0], email=email, role="customer")
    client.force_login(engineer)
    html = client.get(reverse("web-team"), {"org": str(orgs[0].code)}).content.decode()
    # Offline: the stylesheet is inlined below and no script is needed for the layout.
    return re.sub(r"<(link|script)\b[^>]*>(</script>)?", "", html)


@pytest.mark.parametrize("width", [390, 1360])
def test_long_addresses_wrap_at_their_at_sign_and_dots(
    client,
    engineer,
    orgs,
    browser,  # noqa: F811 - the fixture
    width,
):
    html = _team_page(client, engineer, orgs)
    page = browser.new_page(viewport={"width": width, "height": 900})
    try:
        page.set_content(html)
        page.add_style_tag(path=str(CSS))
        got = page.evaluate(LINES)
    finally:
        page.close()

    assert sorted("".join(lines) for lines in got["lines"]) == sorted(EMAILS)
    for lines in got["lines"]:
        for before, after in zip(lines, lines[1:], strict=False):
            assert after[0] in "@." or before.endswith("-"), lines
    if width == 390:
        # The longest address cannot fit one line there: it does wrap.
        assert max(len(lines) for lines in got["lines"]) > 1
    assert got["scrolls"] == [] and got["overflow"] <= 0
