"""The advisor: the field's checklist (../shared/DOMAIN.md §1-6) as rules over a snapshot of
facts about one deployment. PURE: no Django, Celery or Channels — the panel gathers the facts
(changes.services.diagnosis), this package reads them.

``evaluate(snapshot) -> list[Finding]`` (advisor.engine) is the whole interface."""
