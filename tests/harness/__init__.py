"""Test files that tests/test_workers.py runs in a pytest run of its own (named case_*.py, so
the suite's own collection, test_*.py, never picks them up)."""
