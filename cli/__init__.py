"""cli: the ``hicache-sim`` command: one argparse tree, one user-error rule (one line, exit 2)."""
