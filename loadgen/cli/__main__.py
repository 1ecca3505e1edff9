"""``python -m loadgen.cli``: the same as the ``loadgen`` command."""

import sys

from . import main

sys.exit(main())
