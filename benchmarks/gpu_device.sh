#!/usr/bin/env bash
# The GPU target's checks on a GPU machine (docs/BENCHMARKS.md, "GPU target"), one step per argument, in order:
#
#   install  plain `pip install -e .` (as the README does) into the machine's own Python environment, the one that holds its CUDA torch
#            ($QAOPT_GPU_PYTHON), from wheels in .whl/ (the machine has no registry access): no --no-deps,
#            no --ignore-requires-python
#   tests    tests there (pytest-xdist; $QAOPT_GPU_TESTS, default the whole suite), the JUnit report summarized
#            by benchmarks/gpu.py install
#   quick    `qaopt optimize examples/cropfollow-gpu.yaml --profile quick`, timed, summarized by gpu.py quick
#   quick-bg the same, started in the background (its record is written when it ends); `wait` waits for it
#   latency  benchmarks/gpu.py latency on that run's chosen NNs
#
# Records land in $OUT (install.json, quick.json, latency.json and the logs). Each step resumes what an
# earlier call on the same warm machine left (the install, the run's caches).
#
#   bash benchmarks/gpu_device.sh install tests quick latency
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/qaopt-gpu-out}
PY=${QAOPT_GPU_PYTHON:-/opt/torch/.venv/bin/python}
BIN=$(dirname "$PY")
RUN=examples/runs/cropfollow-gpu
mkdir -p "$OUT"

for step in "$@"; do
  case $step in
    install)
      cmd="$PY -m pip install --no-index --find-links .whl -e ."
      { echo "$cmd"; $cmd 2>&1; } > "$OUT/pip.log"
      echo $? > "$OUT/pip.status"; tail -3 "$OUT/pip.log"
      "$PY" -c "import torch, qaopt; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
      ;;
    tests)
      # The tests import qaopt from the install above, not from this folder.
      (cd tests && timeout 420 "$PY" -m pytest -q -n "${QAOPT_GPU_WORKERS:-12}" -p no:cacheprovider --timeout 400 \
        --junitxml="$OUT/junit.xml" ${QAOPT_GPU_TESTS:-.} > "$OUT/tests.log" 2>&1); tail -25 "$OUT/tests.log"
      "$PY" benchmarks/gpu.py install --pip-log "$OUT/pip.log" --pip-status "$(cat "$OUT/pip.status")" \
        --junit "$OUT/junit.xml" --out "$OUT/install.json"
      ;;
    quick)
      start=$(date +%s)
      "$BIN/qaopt" optimize examples/cropfollow-gpu.yaml --profile quick > "$OUT/quick.log" 2>&1
      echo "exit $?"; tail -30 "$OUT/quick.log"
      "$PY" benchmarks/gpu.py quick "$RUN" --seconds $(( $(date +%s) - start )) --out "$OUT/quick.json"
      cp "$RUN/result.json" "$OUT/result.json" 2>/dev/null; cp "$RUN/report.md" "$OUT/report.md" 2>/dev/null
      ;;
    quick-bg)
      setsid nohup bash "$0" quick > "$OUT/quick-bg.log" 2>&1 < /dev/null &
      ;;
    wait)
      while pgrep -f "gpu_device.sh quick" > /dev/null; do sleep 5; done; cat "$OUT/quick-bg.log" | tail -30
      ;;
    latency)
      "$PY" benchmarks/gpu.py latency "$RUN" --out "$OUT/latency.json"
      ;;
    *) echo "unknown step '$step' (install, tests, quick, quick-bg, wait, latency)"; exit 2 ;;
  esac
done
