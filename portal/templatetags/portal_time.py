"""Times the pages write in words: "just now" and "under a minute" where Django's timesince
would say "0 minutes"."""

from __future__ import annotations

from django import template
from django.utils import timezone
from django.utils.timesince import timesince

register = template.Library()


def _seconds_since(value) -> float | None:
    if not value:
        return None
    return (timezone.now() - value).total_seconds()


@register.filter
def ago(value) -> str:
    """When `value` was: "just now" within the last minute, else "N units ago"."""
    seconds = _seconds_since(value)
    if seconds is None:
        return ""
    return "just now" if seconds < 60 else f"{timesince(value)} ago"


@register.filter
def lasted(value) -> str:
    """How long since `value`: "under a minute", else "N units"."""
    seconds = _seconds_since(value)
    if seconds is None:
        return ""
    return "under a minute" if seconds < 60 else timesince(value)


@register.filter
def seconds_ago(value) -> str:
    """Whole seconds since `value` (the job page's "last heard N s ago"), never negative."""
    seconds = _seconds_since(value)
    if seconds is None:
        return ""
    return str(max(0, int(seconds)))
