"""Change workflows, one module per concern:

- ``facts``: what reviewers see of a proposal (validation against the flag spec, diff,
  warnings, predicted impact, how many approvals it needs);
- ``review``: propose, submit, approve/reject, withdraw, comment, rebase;
- ``apply``: start the apply pipeline, ask for a rollback, resume a lost pipeline;
- ``timeline``: the audit entries that are the change's timeline, state transitions;
- ``pipeline``: the worker's side: claim, heartbeat, the loop over ``stages``, ``rollback``;
- ``stages``: the apply pipeline's steps (snapshot, baseline, new version, restart, health,
  verify, compare, done), one class each; ``verification`` runs their benchmarks.

Who may do what lives in ``changes.rules``; every verb here calls it under a row lock.
"""
