"""``python -m scaling.planning``: the planning package from the command line.

    python -m scaling.planning exports --target target.json --kind keda|alerts|grafana

``target.json`` is an ``ExportTarget`` as ``as_dict`` writes it. Bad input exits 2 with one
line on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys

from scaling.planning import exports


def _exports(args: argparse.Namespace) -> int:
    try:
        with open(args.target, encoding="utf-8") as fh:
            target = exports.target_from_dict(json.load(fh))
        out = exports.render(target, args.kind)
    except (OSError, ValueError, TypeError) as exc:
        # json.JSONDecodeError is a ValueError; a field of the wrong type a TypeError.
        print(f"error: {args.target}: {exc}".splitlines()[0], file=sys.stderr)
        return 2
    sys.stdout.write(out.text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scaling.planning")
    commands = parser.add_subparsers(dest="command", required=True)
    cmd = commands.add_parser("exports", help="a KEDA, alert-rules or Grafana file for a target")
    cmd.add_argument("--target", required=True, help="ExportTarget as JSON (a file)")
    cmd.add_argument("--kind", required=True, choices=sorted(exports.KINDS))
    cmd.set_defaults(run=_exports)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
