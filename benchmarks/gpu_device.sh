#!/usr/bin/env bash
# The GPU target's checks on a GPU machine (docs/BENCHMARKS.md, "GPU target"), one step per argument, in order:
#
#   install  plain `pip install .` into a venv that sees the machine's CUDA torch (--system-site-packages),
#            from wheels in .whl/ (the machine has no registry access): no --no-deps, no --ignore-requires-python
#   tests    the test suite there (pytest-xdist), its JUnit report summarized by benchmarks/gpu.py install
#   quick    `qaopt optimize examples/cropfollow-gpu.yaml --profile quick`, timed, summarized by gpu.py quick
#   latency  benchmarks/gpu.py latency on that run's chosen NNs
#
# Records land in $OUT (install.json, quick.json, latency.json and the logs). Each step resumes what an
# earlier call on the same warm machine left (the venv, the run's caches).
#
#   bash benchmarks/gpu_device.sh install tests quick latency
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/qaopt-gpu-out}
VENV=${QAOPT_GPU_VENV:-/tmp/qaopt-gpu-venv}
RUN=examples/runs/cropfollow-gpu
mkdir -p "$OUT"

for step in "$@"; do
  case $step in
    install)
      [ -x "$VENV/bin/python" ] || python3 -m venv --system-site-packages "$VENV"
      cmd="$VENV/bin/pip install --no-index --find-links .whl ."
      { echo "$cmd"; $cmd 2>&1; } > "$OUT/pip.log"
      echo $? > "$OUT/pip.status"; tail -3 "$OUT/pip.log"
      "$VENV/bin/python" -c "import torch, qaopt; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
      ;;
    tests)
      # The tests import qaopt from the install above, not from this folder.
      (cd tests && timeout 420 "$VENV/bin/python" -m pytest -q -n 12 -p no:cacheprovider --timeout 400 \
        --junitxml="$OUT/junit.xml" . > "$OUT/tests.log" 2>&1); tail -25 "$OUT/tests.log"
      "$VENV/bin/python" benchmarks/gpu.py install --pip-log "$OUT/pip.log" --pip-status "$(cat "$OUT/pip.status")" \
        --junit "$OUT/junit.xml" --out "$OUT/install.json"
      ;;
    quick)
      start=$(date +%s)
      "$VENV/bin/qaopt" optimize examples/cropfollow-gpu.yaml --profile quick > "$OUT/quick.log" 2>&1
      echo "exit $?"; tail -30 "$OUT/quick.log"
      "$VENV/bin/python" benchmarks/gpu.py quick "$RUN" --seconds $(( $(date +%s) - start )) --out "$OUT/quick.json"
      cp "$RUN/result.json" "$OUT/result.json" 2>/dev/null; cp "$RUN/report.md" "$OUT/report.md" 2>/dev/null
      ;;
    latency)
      "$VENV/bin/python" benchmarks/gpu.py latency "$RUN" --out "$OUT/latency.json"
      ;;
    *) echo "unknown step '$step' (install, tests, quick, latency)"; exit 2 ;;
  esac
done
