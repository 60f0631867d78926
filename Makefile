# hicache-sim: the two set-up commands are `make demo` and `make test`.
# Both create .venv on first use and install what they need from the package registries.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
# torch is pinned to the CPU wheel that the build machines keep on disk; a bare `torch`
# requirement would pull a multi-GB CUDA build. Installed first so `.[replay]` finds it satisfied.
TORCH_CPU := torch==2.13.0

.PHONY: demo test lint typecheck pytest bench clean native

$(BIN)/python:
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) on PATH (set PYTHON=...)"; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# base install: enough for the simulator, the CLI and the demo (no torch)
$(VENV)/.base: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	@touch $@

# dev install: tests, linters, notebooks, torch (CPU) for the replay tests and Ray for the
# sweep executor's test on a local Ray runtime
$(VENV)/.dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q $(TORCH_CPU)
	$(BIN)/python -m pip install -q -e '.[dev,replay,cluster,native]'
	@touch $@ $(VENV)/.base $(VENV)/.native

# mypyc, for the compiled core (hicache/policy/native.py)
$(VENV)/.native: pyproject.toml | $(VENV)/.base
	$(BIN)/python -m pip install -q -e '.[native]'
	@touch $@

# the compiled core: the same decisions, faster; rebuilt when a compiled module's source
# changed. `make demo` goes on interpreted when it cannot be built.
native: $(VENV)/.native
	$(BIN)/python -m hicache.policy.native build --if-needed

demo: $(VENV)/.base $(VENV)/.native
	$(BIN)/python -m hicache.policy.native build --if-needed --optional
	$(BIN)/hicache-sim demo --out runs/demo --force

lint: $(VENV)/.dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.dev
	$(BIN)/mypy

# the tests that drive the compiled modules, run a second time on the compiled build
NATIVE_TESTS := tests/policy tests/sim tests/test_hitrate.py tests/test_hitrate_storage.py \
	tests/test_engine.py tests/test_storage_sim.py tests/test_sim_storage_run.py \
	tests/test_conformance_harness.py tests/test_run_cli.py tests/test_hitrate_versions.py \
	tests/test_conformance_v0523.py tests/test_engine_v0523.py tests/test_l3_v0523.py \
	tests/test_sim_storage_run_v0523.py tests/test_buffer_only_v0523.py tests/test_pd.py \
	tests/test_pd_decode_l3.py tests/test_tp_votes.py

# the whole suite on the interpreted modules (the reference), then NATIVE_TESTS on the
# compiled build; each on every core (pytest-xdist; a test file stays on one worker, so its
# module fixtures are built once). XDIST= runs them in one process.
XDIST ?= -n auto --dist loadfile
pytest: $(VENV)/.dev
	$(BIN)/python -m hicache.policy.native build --if-needed
	HYPOTHESIS_PROFILE=ci $(BIN)/python -m pytest $(XDIST)
	HICACHE_NATIVE=require HYPOTHESIS_PROFILE=ci $(BIN)/python -m pytest $(XDIST) $(NATIVE_TESTS)

test: lint typecheck pytest

bench: $(VENV)/.dev
	$(BIN)/python bench/policy_ops.py

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache .hypothesis hicache/policy/_native

# bench + calibrate + a short trace replay in one go (replay/device_check.py), results under
# OUT. Where python3 already has a CUDA build of torch (a GPU server, a lent GPU machine with no
# registry) it runs bench/device_check.sh with that python: the CUDA tests, then the check on the
# GPU, a few minutes. Elsewhere it runs the same check on CPU tensors in the dev venv (seconds).
.PHONY: device-check
device-check:
	@if python3 -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then \
	  bash bench/device_check.sh $${OUT:-runs/device-check}; \
	else \
	  $(MAKE) --no-print-directory $(VENV)/.dev && \
	  $(BIN)/python -m replay.device_check --device cpu --out $${OUT:-runs/device-check}; \
	fi

# Opt-in conformance check (not part of `make test`): our policy core side by side with the
# real SGLang cache on random operation sequences (conformance/README.md), for every supported
# SGLang version (`SGLANG_VERSION=0.5.14` or `0.5.23` for one): 0.5.14's HiRadixCache in
# .venv-conformance, 0.5.23's UnifiedRadixCache (both TreeCores; L1/L2 sequences, then L3
# sequences with the storage tier, then L3 sequences in --hicache-host-memory-mode buffer_only,
# the real BufferModePipeline) in .venv-conformance-0.5.23. Any run that mismatches fails it.
# Each venv holds the sglang wheel (--no-deps), the CPU torch wheel and a few light packages;
# when a wheel cannot be had it prints "conformance SKIPPED: <why>" and succeeds.
# Extra options: CONFORMANCE_ARGS="--sequences 10 --steps 50".
SGLANG_VERSION ?= all
CONF_VERSIONS := 0.5.14 0.5.23
CONFORMANCE_ARGS ?=
conf_venv = $(if $(filter 0.5.14,$(1)),.venv-conformance,.venv-conformance-$(1))
conf_module = $(if $(filter 0.5.14,$(1)),conformance.run,conformance.v0523.run)

.PHONY: conformance
conformance:
	@set -e; for v in $(if $(filter all,$(SGLANG_VERSION)),$(CONF_VERSIONS),$(SGLANG_VERSION)); do \
	  $(MAKE) --no-print-directory conformance-one CONF_V=$$v; \
	done

.PHONY: conformance-one
conformance-one:
	@venv=$(call conf_venv,$(CONF_V)); \
	if [ ! -f $$venv/.ready-$(CONF_V) ] || [ conformance/make_venv.sh -nt $$venv/.ready-$(CONF_V) ]; then \
	  bash conformance/make_venv.sh $(PYTHON) $$venv $(CONF_V) $(TORCH_CPU); \
	fi; \
	if [ -f $$venv/.ready-$(CONF_V) ]; then \
	  echo "== conformance against SGLang $(CONF_V)"; rc=0; \
	  $$venv/bin/python -m $(call conf_module,$(CONF_V)) $(CONFORMANCE_ARGS) || rc=1; \
	  if [ "$(CONF_V)" != "0.5.14" ]; then \
	    $$venv/bin/python -m $(call conf_module,$(CONF_V)) --l3 --out runs/conformance-$(CONF_V)-l3 $(CONFORMANCE_ARGS) || rc=1; \
	    $$venv/bin/python -m $(call conf_module,$(CONF_V)) --buffer-only --out runs/conformance-$(CONF_V)-buffer $(CONFORMANCE_ARGS) || rc=1; \
	  fi; \
	  exit $$rc; \
	else \
	  echo "conformance SKIPPED ($(CONF_V)): $$(cat $$venv/.skip-reason 2>/dev/null || echo 'no venv')"; \
	fi
