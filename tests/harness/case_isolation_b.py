"""One of two files that tests/test_workers.py runs on two xdist workers (one file each)."""

import pytest

from tests.harness.claim import claim

pytestmark = pytest.mark.django_db(transaction=True)


def test_claim(redis_url):
    claim(redis_url)
