"""Hypothesis settings for the fuzz suite: a profile per run length, chosen by FUZZ_PROFILE.

`ci` (the default) runs a few thousand cases in all within about two minutes on two cores;
`long` runs ten times as many, for a night. No deadline: a slow case on a loaded machine is not
a failure; a 500 or HTML from the API is.
"""

import os

from hypothesis import HealthCheck, settings

_COMMON = {
    "deadline": None,
    "derandomize": False,
    "print_blob": True,
    "suppress_health_check": [
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
}
settings.register_profile("ci", max_examples=100, **_COMMON)
settings.register_profile("long", max_examples=1000, **_COMMON)

PROFILE = os.environ.get("FUZZ_PROFILE", "ci")
SCALE = {"ci": 1, "long": 10}[PROFILE]


def examples(n: int) -> int:
    """`n` cases under the ci profile, scaled for the others."""
    return n * SCALE
