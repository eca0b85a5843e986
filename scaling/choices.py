"""Choices of the scaling app, shown as coloured badges (``ColouredChoices``). The planning
package speaks plain strings (``Decision.status``, ``Capacity.status``); pages look the
badge up here, so no template keeps its own colour mapping."""

from controlpanel.choices import ColouredChoices


class ProvisioningStatus(ColouredChoices):
    """``Decision.status``: how the replicas running compare with those the load needs."""

    OK = "ok", "OK", "green"
    UNDER = "under", "Under-provisioned", "red"
    OVER = "over", "Over-provisioned", "amber"
    UNKNOWN = "unknown", "Unknown", "grey"


class CapacityStatus(ColouredChoices):
    """``Capacity.status``: what the benchmark history says about one replica's limit."""

    MEASURED = "measured", "Measured", "green"
    ABOVE_TESTED = "above_tested", "Above the highest load tested", "blue"
    NONE_MEETS = "none_meets", "No load tested met the SLO", "red"
    NO_EVIDENCE = "no_evidence", "No evidence", "grey"


def badge(choices: type[ColouredChoices], value: str) -> dict:
    """``{"value", "label", "colour"}`` for ``value`` (grey and as-is when unknown)."""
    try:
        member = choices(value)
    except ValueError:
        return {"value": value, "label": value or "unknown", "colour": "grey"}
    return {"value": member.value, "label": member.label, "colour": member.colour}
