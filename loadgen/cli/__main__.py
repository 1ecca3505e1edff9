"""``python -m loadgen.cli``: the same as the ``loadgen`` command."""

from . import entry

entry()
