"""Logging filters."""

import logging


class QuietFrequentTasks(logging.Filter):
    """Drops the INFO lines of the once-a-second telemetry poll (sent, received, succeeded):
    sixty a minute would bury everything else. Its warnings and errors still pass."""

    NAMES = ("poll_telemetry", "poll-telemetry")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO:
            return True
        message = record.getMessage()
        return not any(name in message for name in self.NAMES)
