#!/usr/bin/env bash
# The one prepared GPU run: the CUDA tests, then bench + calibrate + short replay
# (python -m replay.device_check), everything that matters flat in OUT_DIR.
#
#   bash bench/device_check.sh OUT_DIR [ARGS]   # on a CUDA machine (a lent H100/H200); ARGS go
#                                               # to replay.device_check (e.g. --flush-mib 0)
#   DEVICE=cpu bash bench/device_check.sh DIR   # the same plumbing on CPU tensors (the tests)
#
# Needs only a python with torch, numpy, pandas and pyarrow (PY, default python3): no virtualenv
# and no package registry, as on a lent GPU machine. OUT_DIR receives at most 6 flat files:
# env.txt, cuda-tests.log, device-check.log, summary.md, summary.json, <gpu>-measured.json and
# device-check.tar.gz (all of the check's folder, which lives in WORK, default a temp folder).
# Exit status: the device check's (0 ran, 1 a stage failed or ran out of time, 2 usage); a CUDA
# test failure is reported in cuda-tests.log and env.txt but does not stop the measurements.
# Time limits (SIGINT): TESTS_TIMEOUT (60 s) and CHECK_TIMEOUT (240 s), about 5 minutes in all.
# HICACHE_COMMIT=<sha> records the code's commit where the tree came without .git.
set -uo pipefail
out=${1:?usage: bench/device_check.sh OUT_DIR}
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
WORK=${WORK:-$(mktemp -d)/device-check}
export PYTHONUNBUFFERED=1
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 2  # absolute: we cd to the repo next
cd "$(dirname "$0")/.." || exit 2

{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  echo "commit: ${HICACHE_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
  echo "python: $("$PY" -c 'import sys; print(sys.version.split()[0], sys.executable)' 2>&1)"
  "$PY" -c 'import torch; print("torch:", torch.__version__, "cuda:", torch.version.cuda,
"available:", torch.cuda.is_available())' 2>&1
  command -v nvidia-smi >/dev/null && nvidia-smi -L 2>&1
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv 2>&1
} >"$out/env.txt"
cat "$out/env.txt"

# Correctness first (data round trips, acks, pinned pools on the real device): seconds.
# --noconftest: the suite's conftest wants hypothesis; test_cuda.py imports what it needs.
if "$PY" -c 'import pytest' 2>/dev/null; then
  timeout -s INT -k 10 "${TESTS_TIMEOUT:-60}" "$PY" -m pytest -o addopts="" -q \
    -p no:cacheprovider --noconftest tests/replay/test_cuda.py 2>&1 | tee "$out/cuda-tests.log"
  echo "cuda tests: exit ${PIPESTATUS[0]}" | tee -a "$out/env.txt"
else
  echo "cuda tests: not run (no pytest for $PY)" | tee -a "$out/env.txt" "$out/cuda-tests.log"
fi

# SIGINT at the limit, not SIGTERM: the check then stops its current stage, writes the summary
# of the finished ones and exports it; KILL follows 15 s later only if that hangs
timeout -s INT -k 15 "${CHECK_TIMEOUT:-240}" "$PY" -m replay.device_check --device "$DEVICE" \
  --out "$WORK" --export "$out" "${@:2}" 2>&1 | tee "$out/device-check.log"
rc=${PIPESTATUS[0]}
echo "device check: exit $rc" | tee -a "$out/env.txt"
exit "$rc"
