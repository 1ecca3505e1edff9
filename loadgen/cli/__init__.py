"""``loadgen``: a thin command line over the spec, runner, analysis and report modules."""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from .parser import build_parser, command_in

__all__ = ["build_parser", "main"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(command_in(argv)).parse_args(argv)
    try:
        return args.func(args)
    except Exception as exc:
        from ..core.spec import SpecError  # a command that raised one has imported it already

        if not isinstance(exc, SpecError):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: runs that ended are on disk, the ones that had not are marked interrupted in their "
              "run.json; the same command again runs those (a sweep skips completed runs); `loadgen report DIR` "
              "summarizes what is there", file=sys.stderr)
        return 130

