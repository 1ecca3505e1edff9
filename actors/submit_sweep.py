"""``loadgen sweep`` on a launcher-made cluster's head node:

    ray submit cluster.yaml actors/submit_sweep.py -- agent-loadgen/examples/paired-burst.yaml --out results/pb

``ray submit`` copies this file to the head and runs it with the arguments after ``--``; the
sweep joins the running cluster (``--address auto``) instead of starting one of its own.
"""

import sys

from loadgen.cli import main

if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(["sweep", *args] + ([] if "--address" in args else ["--address", "auto"])))
