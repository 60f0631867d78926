"""Prefill/decode disaggregation (issue 28): prefill servers with their HiCache, the KV
transfer, decode servers with SGLang's decode-side queues (:mod:`sim.pd.engine`)."""

from sim.pd.run import run_pd_simulation

__all__ = ["run_pd_simulation"]
