"""studies: what-if work on top of :mod:`sim` (and lazily :mod:`replay`): sweeps and reports."""
