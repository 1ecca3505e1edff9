"""``loadgen``: a thin command line over the spec, runner, analysis and report modules."""

from __future__ import annotations

import gc
import sys
from typing import Optional, Sequence

from .parser import build_parser, command_in

__all__ = ["build_parser", "entry", "main"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(command_in(argv)).parse_args(argv)
    # the command's imports allocate ~1M objects and free almost none: the collector, run every
    # 700 allocations, would only walk them (~20 ms of a one-seed run's 0.35 s)
    gc.disable()
    try:
        command = args.func.load()
    finally:
        gc.enable()
    try:
        return command(args)
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


def entry() -> None:
    """The ``loadgen`` program: main(), then an exit without the collector's last pass over what
    the command leaves (~30 ms after a simulated run, walking objects the process's end frees whole;
    the command has closed its files, and atexit handlers run as ever)."""
    code = main()
    gc.freeze()
    sys.exit(code)
