"""Scenarios: snapshots of one deployment built from the simulator, as the panel would see them.

Each scenario runs a load through the simulator's engine core (hosts.simulator.core, the code
the simulated servers run) in virtual time, reads what the panel would read — the engine's
gauges and counters over the window, the simulated GPU's telemetry, a benchmark run's per-stage
percentiles, error messages and lengths — and returns a Snapshot for ``evaluate()``. What the
simulator does not model (a power cap, where the engine process is pinned, a starved CPU, a
traffic sample) is the scenario's own explicit condition, said in its docstring.

``SCENARIOS`` names each one with the rules it must raise and those it must not: the confusion
matrix of tests/changes/advisor/test_scenarios.py and scripts/advisor_matrix.py. PURE, like the
rest of the package; deterministic (seeded), so a snapshot is the same on every machine."""

from changes.advisor.scenarios.catalog import (
    CHAT,
    DEMO_SETTINGS,
    LLAMA_8B,
    SCENARIOS,
    Scenario,
    build,
    snapshot,
)
from changes.advisor.scenarios.simulate import (
    Dist,
    SimRun,
    Stage,
    chat_stages,
    engine_window,
    gpu_facts,
    run_facts,
    simulate,
    stage_facts,
)

__all__ = [
    "CHAT",
    "DEMO_SETTINGS",
    "LLAMA_8B",
    "SCENARIOS",
    "Dist",
    "Scenario",
    "SimRun",
    "Stage",
    "build",
    "chat_stages",
    "engine_window",
    "gpu_facts",
    "run_facts",
    "simulate",
    "snapshot",
    "stage_facts",
]
