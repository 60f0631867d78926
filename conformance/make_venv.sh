#!/usr/bin/env bash
# Build the conformance virtualenv: make_venv.sh PYTHON VENV SGLANG_VERSION TORCH_REQ
#
# On success touches VENV/.ready-SGLANG_VERSION. When something cannot be had (no network, no
# such wheel, no CPU torch wheel on disk) it writes the reason to VENV/.skip-reason and exits 0;
# the Makefile then prints one "conformance SKIPPED: <why>" line.
set -u
PY=$1
VENV=$2
VERSION=$3
TORCH=$4
STAMP="$VENV/.ready-$VERSION"

skip() {
  mkdir -p "$VENV"
  echo "$1" >"$VENV/.skip-reason"
  exit 0
}

command -v "$PY" >/dev/null 2>&1 || skip "$PY is not on PATH (set PYTHON=...)"
if [ ! -x "$VENV/bin/python" ]; then
  echo "building $VENV (sglang==$VERSION, CPU torch)"
  "$PY" -m venv "$VENV" || skip "could not create $VENV with $PY"
fi
rm -f "$VENV/.skip-reason" "$VENV"/.ready-*
PIP=("$VENV/bin/python" -m pip install -q)

# torch: only the CPU wheel on this machine's disk (--no-index); a registry torch is a
# multi-GB CUDA build. Its own small dependencies come from the registry afterwards.
if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  "${PIP[@]}" --no-index --no-deps "$TORCH" >/dev/null 2>&1 ||
    skip "the CPU wheel $TORCH is not on this machine's disk (pip --no-index found none)"
fi
"${PIP[@]}" "$TORCH" || skip "pip could not install the dependencies of $TORCH"
"$VENV/bin/python" -W ignore -c "import sys, torch; sys.exit(bool(torch.version.cuda))" ||
  skip "$VENV has a CUDA build of torch; remove $VENV and retry"

WHEELS=$(mktemp -d)
trap 'rm -rf "$WHEELS"' EXIT
"$VENV/bin/python" -m pip download -q --no-deps --retries 1 --timeout 30 -d "$WHEELS" "sglang==$VERSION" >/dev/null 2>&1 ||
  skip "pip could not download sglang==$VERSION (no network, or no such version)"
"${PIP[@]}" --no-deps "$WHEELS"/sglang-*.whl || skip "pip could not install the sglang wheel"
if [ -f "conformance/requirements-$VERSION.txt" ]; then
  # a version-specific list (0.5.23+): its packages must not move torch off the CPU wheel
  echo "$TORCH" >"$WHEELS/torch-constraint.txt"
  "${PIP[@]}" -c "$WHEELS/torch-constraint.txt" -r "conformance/requirements-$VERSION.txt" ||
    skip "pip could not install conformance/requirements-$VERSION.txt"
  "$VENV/bin/python" -W ignore -c "import sys, torch; sys.exit(bool(torch.version.cuda))" ||
    skip "installing conformance/requirements-$VERSION.txt brought a CUDA torch"
else
  "${PIP[@]}" -r conformance/requirements.txt ||
    skip "pip could not install conformance/requirements.txt"
fi
"${PIP[@]}" --no-deps -e . || exit 1
touch "$STAMP"
