"""The device check's parts (``python -m replay.device_check``, whose module docstring says what
the check does), by job:

* :mod:`replay.check.plan`: what the check measures on CUDA or on CPU tensors, the trace it
  replays and the GPU preset its profile is for;
* :mod:`replay.check.stages`: the isolated stages (bench, calibrate, a replay per IO backend);
* :mod:`replay.check.summary`: the figures against the replay issue's targets, ``summary.json``
  and ``summary.md``;
* :mod:`replay.check.export`: the flat files a lent GPU machine's result folder hands back.

Importing any of them loads nothing beyond the standard library (torch, numpy and pandas are
imported when a stage runs), so ``replay.device_check`` can report a missing package itself.
"""
