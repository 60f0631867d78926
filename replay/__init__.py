"""Real-copy replay and calibration of HiCache's host<->device transfers (needs torch).

The modules, from the bottom up:

* :mod:`replay.runtime`: two in-order copy streams (SGLang's write and load streams) with timing
  marks, on CUDA (streams + CUDA events) or on the CPU (synchronous, wall clock; or deferred, so
  tests can step a stream one work item at a time).
* :mod:`replay.pools`: the device KV tensor and the host tensor in SGLang's layouts
  (``layer_first``, ``page_first``), sized from a model and scaled to fit the machine.
* :mod:`replay.transfer`: one write or load as real copies, through the ``direct`` backend (one
  copy per contiguous run) or the ``kernel``-like backend (index gather/scatter + one copy).
* :mod:`replay.controller`: :class:`~replay.controller.TorchController`, the policy core's
  TransferController doing those copies, acking in FIFO order when their marks complete.
* :mod:`replay.bench`: the microbenchmarks (config, the op sweep, the run), with
  :mod:`replay.bench_copies` (plain and both-directions copies, the cache flush),
  :mod:`replay.bench_compute` (GEMM and HBM rows) and :mod:`replay.bench_rows` (the row table).
* :mod:`replay.fit`, :mod:`replay.calibrate`: the least-squares fits of ``hicache.latency``'s
  constants to those rows, and the profile assembled from them.
* :mod:`replay.driver`, :mod:`replay.run`, :mod:`replay.run_summary`: a trace through the
  policy core on real copies, in batches, the run around it (settings, plain-copy peak) and
  its figures (measured vs predicted per op).
* :mod:`cli.replay`: the ``hicache-sim replay`` command; :mod:`replay.device_check`: bench +
  calibrate + short replay in one go on a CUDA machine (``make device-check``), its parts in
  :mod:`replay.check`.
* :mod:`replay.outputs` (atomic Parquet/CSV/JSON writes) and :mod:`replay.presets` (CUDA device
  name -> ``hicache.hardware`` GPU preset): small helpers without torch.

Importing this package imports nothing (torch included): every module imports torch itself, so
``hicache-sim --help`` works without torch.
"""
