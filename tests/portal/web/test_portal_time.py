"""The pages' times in words, and their pager."""

from datetime import timedelta

from django.template import Context, Template
from django.utils import timezone


def _render(text: str, **context) -> str:
    return Template("{% load portal_time %}" + text).render(Context(context))


def test_a_moment_ago_reads_just_now_and_under_a_minute_not_zero_minutes():
    now = timezone.now()
    assert _render("{{ t|ago }}", t=now - timedelta(seconds=5)) == "just now"
    assert _render("{{ t|lasted }}", t=now - timedelta(seconds=59)) == "under a minute"
    assert _render("{{ t|ago }}", t=now - timedelta(minutes=3, seconds=5)) == "3\xa0minutes ago"
    assert _render("{{ t|lasted }}", t=now - timedelta(hours=2)) == "2\xa0hours"
    assert _render("[{{ t|ago }}{{ t|lasted }}]", t=None) == "[]"


def test_the_pager_links_the_pages_before_and_after_with_their_labels():
    from django.core.paginator import Paginator

    pages = Paginator(list(range(120)), 50)
    text = '{% include "web/partials/pager.html" with page=p earlier="faster" later="slower" %}'
    first = Template(text).render(Context({"p": pages.page(1)}))
    assert "page 1 of 3" in first and '?page=2">slower →' in first and "faster" not in first
    middle = Template(text).render(Context({"p": pages.page(2)}))
    assert '?page=1">← faster' in middle and '?page=3">slower →' in middle
    alone = Template(text).render(Context({"p": Paginator([1], 50).page(1)}))
    assert "pager" not in alone
