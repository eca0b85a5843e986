"""The rules. Each is a function of a Snapshot registered with ``@rule("id")``; its thresholds
are named constants with a comment saying why. They live in four modules by what they read:

- ``rules_load``: the engine under its load (queue-bound, kv-bound, prefill-bound,
  decode-bound, prefix-cache, tail-growth);
- ``rules_config``: the config's sizing (length-rejections, max-model-len-oversized,
  no-memory-headroom, tp-unneeded);
- ``rules_host``: the machine (gpu-throttled, cpu-bound, numa-mismatch);
- ``rules_runs``: how it was measured (errors-behind-speed, warmup-included,
  profile-unlike-traffic).

Importing this module registers them all (``engine.evaluate`` does)."""

from changes.advisor import rules_config, rules_host, rules_load, rules_runs  # noqa: F401
