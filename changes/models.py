"""Change requests arrive with the review workflow; until then the app shows config history."""
