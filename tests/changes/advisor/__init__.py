"""Tests of the advisor: the pure rule engine (changes/advisor) and its scenarios."""
