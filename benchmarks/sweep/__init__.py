"""Tuning sweeps, the predict phase (pure: no Django): a search space of engine flags, an SLO,
and the simulator's estimate of the highest load each point holds it at, ranked.

``search`` also serves the real trials: ``step_search`` walks a real benchmark's load from the
predicted limit. ``python -m benchmarks.sweep`` runs a prediction from the command line.
"""

from benchmarks.sweep.load import (
    PREDICTION_REQUESTS,
    SWEEP_REQUESTS,
    apply_load,
    sweep_workload,
    with_load,
    workloads,
)
from benchmarks.sweep.predict import (
    MODES,
    OBJECTIVES,
    PointScore,
    PredictError,
    Prediction,
    candidates,
    pareto_front,
    predict_space,
    score_point,
)
from benchmarks.sweep.search import Probe, SearchResult, bisect_max_load, step_search
from benchmarks.sweep.slo import Slo, SloCheck, SloError
from benchmarks.sweep.space import (
    MAX_POINTS,
    MAX_VALUES_PER_FLAG,
    Dimension,
    SearchSpace,
    SpaceError,
    parse_dimension_text,
    parse_space,
)

__all__ = [
    "MAX_POINTS",
    "MAX_VALUES_PER_FLAG",
    "MODES",
    "OBJECTIVES",
    "PREDICTION_REQUESTS",
    "SWEEP_REQUESTS",
    "Dimension",
    "PointScore",
    "PredictError",
    "Prediction",
    "Probe",
    "SearchResult",
    "SearchSpace",
    "Slo",
    "SloCheck",
    "SloError",
    "SpaceError",
    "apply_load",
    "bisect_max_load",
    "candidates",
    "pareto_front",
    "parse_dimension_text",
    "parse_space",
    "predict_space",
    "score_point",
    "step_search",
    "sweep_workload",
    "with_load",
    "workloads",
]
