"""``python -m hosts.simulator vllm MODEL [vllm serve flags] [simulator options]``
``python -m hosts.simulator sglang --model-path MODEL [server args] [simulator options]``

Starts a simulated GPU server that takes the real engine's flags, fails like it on bad or
infeasible settings (exit 2 for argument errors, 1 for start failures), logs its KV capacity
like it, and serves its HTTP API.
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys

from hosts.engines import get_spec
from hosts.engines.catalog import GPUS, UnknownModel, resolve_gpu
from hosts.engines.flags import EngineArgError
from hosts.simulator.config import StartupError, build_config
from hosts.simulator.quality import KnowledgeError, QualityModel

ENGINE_VERSIONS = {"vllm": "0.11.0", "sglang": "0.5.3"}
USAGE = {
    "vllm": "vllm serve [model_tag] [options]",
    "sglang": "launch_server.py --model-path MODEL_PATH [options]",
}


def simulator_options(parser: argparse.ArgumentParser, engine_has_seed: bool) -> None:
    group = parser.add_argument_group("simulator")
    group.add_argument(
        "--gpu", choices=sorted(GPUS), default="h100-sxm", help="GPU model to simulate"
    )
    group.add_argument("--num-gpus", type=int, default=1, help="GPUs in the simulated host")
    group.add_argument(
        "--startup-seconds",
        type=float,
        default=0.0,
        help="seconds /health answers 503 before the engine is ready",
    )
    if not engine_has_seed:  # vllm's own --seed seeds the simulation too
        group.add_argument(
            "--seed",
            dest="sim_seed",
            type=int,
            default=0,
            help="seed of the simulated output lengths and texts",
        )
    group.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="wall seconds per simulated second (0.1 = ten times faster, 0 = as fast as possible)",
    )
    group.add_argument("--engine-version", default=None, help="version /version reports")
    group.add_argument(
        "--knowledge",
        default=None,
        metavar="FILE",
        help="JSON Lines of prompts the simulated model knows and their answers "
        "(format: hosts.simulator.quality)",
    )


def parse(engine: str, argv: list[str]):
    spec = get_spec(engine)
    parser = spec.parser(usage=USAGE[engine], add_help=True)
    simulator_options(parser, "seed" in spec.by_dest)
    try:
        ns = parser.parse_args(argv)
    except EngineArgError as exc:
        message = str(exc)
        # vllm's top-level parser reports unknown flags; the serve subparser bad values.
        prog = "vllm" if engine == "vllm" and message.startswith("unrecognized") else spec.prog
        print(f"usage: {USAGE[engine]}\n{prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2) from None
    values = vars(ns)
    sim = {
        k: values.pop(k)
        for k in ("gpu", "num_gpus", "startup_seconds", "time_scale", "engine_version")
    }
    knowledge = values.pop("knowledge")
    if knowledge is not None:  # only when given: the options of a plain engine stay as they were
        sim["knowledge"] = knowledge
    sim["sim_seed"] = values.pop("sim_seed", None) or values.get("seed") or 0
    model = values.pop("model")
    settings = {k: v for k, v in values.items() if v is not None}
    return model, settings, sim


def spec_prog(engine: str) -> str:
    return get_spec(engine).prog


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("vllm", "sglang"):
        print(
            "usage: python -m hosts.simulator {vllm MODEL | sglang --model-path MODEL} "
            "[engine flags] [--gpu ...]",
            file=sys.stderr,
        )
        return 2
    engine = argv.pop(0)
    if engine == "vllm" and argv[:1] == ["serve"]:
        argv.pop(0)  # accept `vllm serve MODEL` spelled out too
    model, settings, sim = parse(engine, argv)
    logging.basicConfig(
        level=logging.INFO, format="%(levelname)s %(asctime)s %(message)s", stream=sys.stderr
    )
    log = logging.getLogger(f"{engine}.simulator")
    gpu = resolve_gpu(sim["gpu"])
    try:
        cfg = build_config(engine, model, settings, gpu, sim["num_gpus"])
    except (StartupError, UnknownModel, EngineArgError) as exc:
        kind = getattr(exc, "exception", "ValueError")
        log.error(
            "EngineCore failed to start." if engine == "vllm" else "Scheduler hit an exception."
        )
        print(f"{kind}: {exc}", file=sys.stderr)
        return 1
    try:
        quality = QualityModel.for_config(cfg, sim.get("knowledge"))
    except KnowledgeError as exc:
        # A file the operator named and the simulator cannot use: refused like a bad argument.
        print(
            f"usage: {USAGE[engine]}\n{spec_prog(engine)}: error: --knowledge: {exc}",
            file=sys.stderr,
        )
        return 2
    log.info("Simulating %d × %s (%s) for %s", sim["num_gpus"], gpu.nvml_name, engine, model)
    if quality.items:
        log.info("Knowledge: %d prompts from %s", len(quality.items), sim.get("knowledge"))
    for line in cfg.log_lines:
        log.info(line)

    # The web stack loads only for an engine that will serve: a bad flag or a startup error
    # answers without it, as quickly as the real CLIs refuse.
    import uvicorn

    # Loaded only to serve: a usage error or --help answers without the server's imports.
    from hosts.simulator.runner import EngineRunner
    from hosts.simulator.server import create_app

    runner = EngineRunner(
        cfg,
        time_scale=sim["time_scale"],
        startup_seconds=sim["startup_seconds"],
        seed=sim["sim_seed"],
        engine_version=sim["engine_version"] or ENGINE_VERSIONS[engine],
        quality=quality,
    )
    host = cfg.host or "0.0.0.0"  # noqa: S104 - the engine's own default
    config = uvicorn.Config(
        create_app(runner),
        host=host,
        port=cfg.port,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=30,
    )
    # Everything built so far lives as long as the server: keep the cyclic GC from walking
    # it again and again (full collections would stall the event loop under load).
    gc.collect()
    gc.freeze()
    log.info("Starting the API server on http://%s:%d", host, cfg.port)
    uvicorn.Server(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
