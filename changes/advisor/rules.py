"""The rules (filled in by the issue-17 work). Each is a function of a Snapshot registered
with ``@rule("id")``; its thresholds are named constants with a comment saying why."""
