"""The lab's tests run by hand (`pytest lab/tests`), not in CI. The portal driver's borrow the
portal tests' organisations and users."""

from tests.conftest import pytest_collection_modifyitems  # noqa: F401, E402 - the gpu skip
from tests.portal.conftest import _fast_password_hashing, customer, orgs  # noqa: F401
