"""One of two files that tests/test_workers.py runs on two xdist workers (one file each)."""

import time

import pytest

from tests.harness.claim import claim

pytestmark = pytest.mark.django_db(transaction=True)


def test_claim(redis_url):
    claim(redis_url)


def test_deliberately_slow():
    time.sleep(1.5)  # over the budget the outer test sets (--budget-unit 1)


def test_quick():
    pass
