"""Placeholder: the engine signal poller (filled in by the signals work)."""


def poll_signals() -> int:
    return 0
