"""The pages' times in words."""

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
