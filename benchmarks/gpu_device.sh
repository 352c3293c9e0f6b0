#!/usr/bin/env bash
# The device machine's runs, one step per argument, in order: the GPU target's checks (docs/BENCHMARKS.md, "GPU
# target") and the real result on its CPU:
#
#   install  plain `pip install -e .` (as the README does) into the machine's own Python environment, the one that holds its CUDA torch
#            ($QAOPT_GPU_PYTHON), from wheels in .whl/ (the machine has no registry access): no --no-deps,
#            no --ignore-requires-python
#   tests    tests there (pytest-xdist; $QAOPT_GPU_TESTS, default the whole suite), the JUnit report summarized
#            by benchmarks/gpu.py install
#   quick    `qaopt optimize examples/cropfollow-gpu.yaml --profile quick`, timed, summarized by gpu.py quick
#   quick-bg the same and then `latency`, started in the background (records written when each ends); `wait` waits
#            for it, `poll` too
#   latency  benchmarks/gpu.py latency on that run's chosen NNs; with $QAOPT_TVM_TRIALS set (after tvm-install), TVM
#            too, tuned with that many trials
#   default-compact, default-resnet18
#            `qaopt optimize` of examples/cropfollow-gpu.yaml or examples/cropfollow-resnet18-gpu.yaml with the
#            default profile, started in the background, each on a GPU and a half of the cores of its own where the
#            machine has two GPUs (the first half and GPU 0 for ResNet-18), so that two runs never share a GPU or
#            a measured core; on a machine with one GPU, start one of them at a time: it gets every core;
#            its record (gpu.py default) is written when it ends, then its chosen NNs are timed (gpu.py latency,
#            latency-<name>.json), so that a device session needs no call of its own for them
#            (its log and records in $BG, /tmp/qaopt-gpu-bg: a later call's $OUT is another folder)
#   progress the last lines of each background run's log, and a snapshot of each run into $OUT (<name>-snapshot.tgz)
#   poll     wait up to $QAOPT_POLL_S seconds (default 500) while a default run goes on, then progress; says whether
#            any is still running (poll again at once: the machine is given back after 30 s idle)
#   restore  on a fresh machine, put back the run folders and logs of the snapshots in .device-snapshots/ (carried:
#            copy the last poll's <name>-snapshot.tgz there), so that default-<name> resumes the run: its region,
#            studies and closed-loop evidence are read back; the NNs are rebuilt (the cache stays behind: ResNet-18
#            candidates are 45 MB each) and every rebuilt candidate is re-checked against the region
#   wait-default  wait for the background default runs to end
#   collect  copy the background runs' logs and records into this call's $OUT (the real result's: its figures,
#            result, report, log and state, not its run folder and cache)
#   latency-compact, latency-resnet18  benchmarks/gpu.py latency on that default run's chosen NNs, on its GPU
#   tvm-part    keep the TVM archive's parts and wheels carried in .tvm-parts/ (made here by `bash
#               benchmarks/device_parts.sh tvm`; the wheel is larger than one call may carry, so a part a call, and
#               .whl in a third: call 1 carries .tvm-parts/1 (tvm-part), call 2 .tvm-parts/2 (tvm-part tvm-install),
#               call 3 .whl (install reference-tvm poll), each within 30 s of the last)
#   tvm-install join the parts, unpack TVM with its wheels into $TVM_SITE; every later step of any call imports it
#   reference-tvm  benchmarks/gpu.py reference on the compact GPU spec with --tvm-trials $QAOPT_TVM_TRIALS (default
#               128) and --tvm-seconds $QAOPT_TVM_SECONDS (default 300), in the background (poll, collect:
#               reference-tvm.json, .log)
#   ov-install  unpack OpenVINO carried in .ov-parts/ (made here by `bash benchmarks/device_parts.sh openvino`;
#               23 MB, so one call carries it with .whl) into $OV_SITE; every later step of any call imports it
#   real     the real result (docs/BENCHMARKS.md, "The real result: ResNet-18 CropFollow on a pinned 2-thread
#            CPU target"): benchmarks/real_result.py on examples/cropfollow-resnet18.yaml with the EKF, the default
#            profile, its CPU target on 2 pinned cores of this host (the pool's workers kept off them), the references
#            trained on the GPU, and the spec fields in $QAOPT_REAL_SET (default: each side on the faster of OpenVINO
#            and ONNX Runtime, trials timed on OpenVINO, bf16 among the dtypes, 48 validation drives per NN), in the
#            background; it saves its resumable state every 30 s to $BG/real/state.tar.gz, which `progress`
#            copies into $OUT (real-state.tar.gz). On a fresh machine, carry the last one as
#            .device-snapshots/real-state.tar.gz and `real` resumes from it.
#   merge-resnet18  benchmarks/merge_distillation.py on examples/cropfollow-resnet18.yaml, distilled on the GPU, each
#            order of its merge group (which NN leads) for each of $QAOPT_MERGE_STEPS (default 3000 1200 300), 48
#            closed-loop runs a variant on the cores, in the background (poll; collect brings
#            merge/merge_distillation_resnet18_<order>.json and merge.log)
#   readme-cpu  the README's first command as on a 2-core CPU machine (the quick profile's time goal): `qaopt optimize
#            examples/cropfollow.yaml --profile quick`, empty cache, on cores 0-1 of this host with the GPU hidden
#            and 2 threads, in the background; `progress` (and so `poll`) shows its log and brings $OUT/readme-cpu.tgz
#            (its log, wall seconds, stage seconds, report and result)
#   merge-adapt  benchmarks/merge_distillation.py on $QAOPT_MERGE_SPEC (default examples/cropfollow.yaml): its merged
#            NN in int8 at each scale:adaptation-steps[:pruning:fine-tuning-steps] of $QAOPT_MERGE_VARIANTS (default
#            0.5:160 0.5:480 0.5:1000), $QAOPT_MERGE_RUNS closed-loop runs each (default 48) from seed
#            $QAOPT_MERGE_SEED_BASE, in the background (poll; collect brings merge/merge_adapt_$QAOPT_MERGE_NAME.json,
#            default merge_adapt_0.5.json, and merge.log): whether a longer adaptation keeps a scaled merged NN
#   fidelity benchmarks/fidelity_closed_loop.py on $QAOPT_FIDELITY_SPEC (default examples/cropfollow.yaml): configurations
#            $QAOPT_FIDELITY_ONLY (default all), every NN variant fine-tuned on the GPU under seed $QAOPT_FIDELITY_SEED
#            (default 0), 48 closed-loop runs a configuration on the cores, in the background into $BG/fidelity (poll;
#            progress and collect bring $OUT/fidelity.tgz: its log, variants, residuals and finished configurations)
#   scene-errors  benchmarks/fidelity_scene_errors.py on each fidelity set of $QAOPT_SCENE_SETS (default
#            "seed2 seed1", folders of docs/benchmarks/fidelity_device/) in turn, in the background into
#            $BG/scene-errors/<set> (poll; progress and collect bring $OUT/scene-errors.tgz): each set's variants
#            rebuilt on the GPU and checked against the bytes that ran closed-loop, measured on drives through the
#            set's closed-loop seeds and through fresh looks; $QAOPT_SCENE_ARGS are passed on (e.g. "--steps 0
#            --steered 8,10": those configurations' failed runs driven again, every frame's outputs kept)
#   scenes   benchmarks/scene_failures.py on the real result's state (the running one's, else the carried
#            snapshot) with the same spec fields and --reference: which selection seeds the validated configurations'
#            real NNs failed, whether perfect NNs, their injected errors and the reference NNs fail them too
#            ($OUT/scene_failures_resnet18.json)
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
BG=/tmp/qaopt-gpu-bg
# A default run, or the latency step that follows it. The brackets keep pgrep from matching a command line that only
# names the pattern (the device call's own shell, a poll loop's).
RUNNING="[q]aopt optimize|[g]pu.py (default|latency|reference)|[g]pu_device.sh quick latency|[r]eal_result.py|[m]erge_distillation.py|[f]idelity_closed_loop.py|[f]idelity_scene_errors.py"
TVM_SITE=/tmp/tvm-site OV_SITE=/tmp/ov-site
# TVM and OpenVINO, where tvm-install and ov-install put them (the machine's Python has neither: they come carried).
[ -d "$TVM_SITE/tvm" ] && export PYTHONPATH=$TVM_SITE${PYTHONPATH:+:$PYTHONPATH}
[ -d "$OV_SITE/openvino" ] && export PYTHONPATH=$OV_SITE${PYTHONPATH:+:$PYTHONPATH}
# The real result's spec fields: each side on the faster of OpenVINO and ONNX Runtime, trials timed on OpenVINO; bf16
# beside fp32 and int8 (OpenVINO runs it on the host's AMX, so the agnostic side may keep an NN's error in bf16); 48
# validation drives per NN instead of 16, so the agnostic rule's 2 % test can resolve near-reference candidates (at 16
# it rejects every candidate but the references, and the baseline is the uncompressed fp32 NNs).
REAL_SET=${QAOPT_REAL_SET:-"target.backend=auto target.backends=[openvino,onnxruntime] target.search_backend=openvino \
approximations.all.quantization.dtypes=[fp32,bf16,int8] nns.heading.data.args.val_drives=48 \
nns.distance.data.args.val_drives=48"}
mkdir -p "$OUT" "$BG"

# real_sets: $REAL_SET as the array `sets` of --set arguments (split on spaces, no globbing: a value may hold brackets).
real_sets() {
  local fields field
  read -ra fields <<< "$REAL_SET"
  sets=(); for field in "${fields[@]}"; do sets+=(--set "$field"); done
}

# A default run's spec, run folder, GPU and cores: $1 is compact or resnet18.
placement() {
  local half=$(( $(nproc) / 2 )) gpus
  gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
  case $1 in
    resnet18) SPEC=examples/cropfollow-resnet18-gpu.yaml; DIR=examples/runs/cropfollow-resnet18-gpu; GPU=0
              CORES="0-$(( half - 1 ))" ;;
    compact)  SPEC=examples/cropfollow-gpu.yaml; DIR=examples/runs/cropfollow-gpu; GPU=$(( gpus > 1 ? 1 : 0 ))
              CORES="$half-$(( $(nproc) - 1 ))" ;;
    *) echo "unknown default run '$1' (compact, resnet18)"; exit 2 ;;
  esac
  # One GPU: one run at a time gets every core (its closed-loop runs are the slow part).
  [ "$gpus" -gt 1 ] || CORES="0-$(( $(nproc) - 1 ))"
}

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
      # Its records in $BG/quick (a later call's $OUT is another folder): `collect` brings them back.
      mkdir -p "$BG/quick"
      OUT=$BG/quick setsid nohup bash "$0" quick latency > "$BG/quick-bg.log" 2>&1 < /dev/null &
      ;;
    wait)
      while pgrep -f "[g]pu_device.sh quick latency" > /dev/null; do sleep 5; done; tail -30 "$BG/quick-bg.log"
      ;;
    latency)
      "$PY" benchmarks/gpu.py latency "$RUN" --tvm-trials "${QAOPT_TVM_TRIALS:-0}" --out "$OUT/latency.json"
      ;;
    default-compact|default-resnet18)
      name=${step#default-}; placement "$name"
      # Each run its own lock folder: the two GPUs are two devices, measured at the same time.
      setsid nohup env CUDA_VISIBLE_DEVICES=$GPU QAOPT_LOCK_DIR=/tmp/qaopt-locks-$name taskset -c "$CORES" bash -c "
        start=\$(date +%s)
        '$BIN/qaopt' optimize '$SPEC' --profile default >> '$BG/$name.log' 2>&1
        echo \"exit \$?\" >> '$BG/$name.log'
        '$PY' benchmarks/gpu.py default '$DIR' --seconds \$(( \$(date +%s) - start )) --out '$BG/$name.json'
        cp '$DIR/result.json' '$BG/$name-result.json'; cp '$DIR/report.md' '$BG/$name-report.md'
        '$PY' benchmarks/gpu.py latency '$DIR' --out '$BG/latency-$name.json' >> '$BG/$name.log' 2>&1" \
        > "$BG/$name-bg.log" 2>&1 < /dev/null &
      echo "$name: $SPEC on GPU $GPU, cores $CORES"
      ;;
    readme-cpu)
      mkdir -p "$BG/readme-cpu"
      setsid nohup bash -c "start=\$(date +%s); CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=2 taskset -c 0,1 '$BIN/qaopt' \
        optimize examples/cropfollow.yaml --profile quick --out '$BG/readme-cpu/run' > '$BG/readme-cpu/log.txt' 2>&1; \
        echo \"exit \$? seconds \$(( \$(date +%s) - start ))\" > '$BG/readme-cpu/seconds.txt'" \
        > /dev/null 2>&1 < /dev/null &
      ;;
    progress)
      if [ -d "$BG/readme-cpu" ]; then
        echo "== readme-cpu"; tail -c 1500 "$BG/readme-cpu/log.txt" | tr '\r' '\n' | tail -12
        cat "$BG/readme-cpu/seconds.txt" 2>/dev/null
        (cd "$BG/readme-cpu" && tar czf "$OUT/readme-cpu.tgz" log.txt seconds.txt run/stage_seconds.json run/report.md \
          run/result.json 2>/dev/null)
      fi
      # Each poll also brings back a snapshot of each run (its logs, and its run folder less the exported NNs: the
      # study, region, closed-loop evidence, result; and the closed-loop runs' blocks of the shared cache, so that a
      # resumed run does not validate again), so that a machine lost mid-run keeps what ran until then.
      for log in "$BG/quick/quick.log" "$BG/quick-bg.log"; do
        [ -f "$log" ] && { echo "== $log"; tail -c 1500 "$log" | tr '\r' '\n' | tail -12; }
      done
      [ -f "$BG/merge.log" ] && { echo "== merge"; tail -c 1500 "$BG/merge.log" | tr '\r' '\n' | tail -12; }
      if [ -f "$BG/fidelity.log" ]; then
        echo "== fidelity"; tail -c 1500 "$BG/fidelity.log" | tail -12
        tar czf "$OUT/fidelity.tgz" -C "$BG" fidelity fidelity.log
      fi
      if [ -f "$BG/scene-errors.log" ]; then
        echo "== scene-errors"; tail -c 1500 "$BG/scene-errors.log" | tail -12
        tar czf "$OUT/scene-errors.tgz" -C "$BG" scene-errors scene-errors.log
      fi
      if [ -f "$BG/real.log" ]; then
        echo "== real"; tail -c 1500 "$BG/real.log" | tr '\r' '\n' | tail -12
        [ -f "$BG/real/state.tar.gz" ] && cp "$BG/real/state.tar.gz" "$OUT/real-state.tar.gz"
      fi
      for name in resnet18 compact; do
        [ -f "$BG/$name.log" ] || continue
        echo "== $name"; tail -c 1500 "$BG/$name.log" | tr '\r' '\n' | tail -12
        placement "$name"
        tar czf "$OUT/$name-snapshot.tgz" --exclude="$DIR/artifacts" "$BG/$name"* "$DIR" \
          examples/.qaopt-cache/optimize/validation 2>/dev/null
      done
      ;;
    restore)
      for snapshot in .device-snapshots/*-snapshot.tgz; do
        [ -f "$snapshot" ] || { echo "no snapshots in .device-snapshots/"; break; }
        tar xzf "$snapshot" --exclude='tmp/*' && tar xzf "$snapshot" -C / --wildcards 'tmp/*'
        echo "restored $snapshot"
      done
      ;;
    collect)
      # The real result's run folder and cache stay (candidates of 45 MB), as do the merge variants' caches: its
      # figures, log, report and state come, and the variants' figures.
      (cd "$BG" && tar cf - --exclude=./real --exclude='./merge/cache-*' --exclude=./fidelity-cache . | tar xf - -C "$OUT")
      if [ -d "$BG/real" ]; then
        mkdir -p "$OUT/real"
        cp "$BG/real/real_result.json" "$BG/real/run/result.json" "$BG/real/run/report.md" "$OUT/real/" 2>/dev/null
        [ -f "$BG/real/state.tar.gz" ] && cp "$BG/real/state.tar.gz" "$OUT/real-state.tar.gz"
      fi
      ;;
    wait-default)
      while pgrep -f "$RUNNING" > /dev/null; do sleep 5; done
      ;;
    poll)
      # Up to $QAOPT_POLL_S seconds (default 500) for the default runs and their latency steps, then `progress`.
      end=$(( SECONDS + ${QAOPT_POLL_S:-500} ))
      while [ $SECONDS -lt $end ] && pgrep -f "$RUNNING" > /dev/null; do sleep 5; done
      bash "$0" progress
      pgrep -f "$RUNNING" > /dev/null && echo "still running" || echo "every default run has ended"
      ;;
    latency-compact|latency-resnet18)
      name=${step#latency-}; placement "$name"
      CUDA_VISIBLE_DEVICES=$GPU taskset -c "$CORES" "$PY" benchmarks/gpu.py latency "$DIR" --out "$OUT/latency-$name.json"
      ;;
    tvm-part)
      mkdir -p /tmp/tvm-parts && cp .tvm-parts/*/* /tmp/tvm-parts/ && ls /tmp/tvm-parts
      ;;
    tvm-install)
      cat /tmp/tvm-parts/tvm.tar.xz.part* > /tmp/tvm.tar.xz && mkdir -p "$TVM_SITE" && tar -C "$TVM_SITE" -xJf /tmp/tvm.tar.xz \
        && "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$TVM_SITE" /tmp/tvm-parts/*.whl || exit 1
      PYTHONPATH=$TVM_SITE "$PY" -c "import torch, tvm; print('tvm', tvm.__version__, 'CUDA runtime', tvm.runtime.enabled('cuda'))"
      ;;
    reference-tvm)
      setsid nohup "$PY" benchmarks/gpu.py reference examples/cropfollow-gpu.yaml --tvm-trials "${QAOPT_TVM_TRIALS:-128}" \
        --tvm-seconds "${QAOPT_TVM_SECONDS:-300}" --out "$BG/reference-tvm.json" > "$BG/reference-tvm.log" 2>&1 < /dev/null &
      ;;
    ov-install)
      mkdir -p "$OV_SITE" && tar -C "$OV_SITE" -xJf .ov-parts/openvino.tar.xz \
        && "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$OV_SITE" .ov-parts/*.whl || exit 1
      export PYTHONPATH=$OV_SITE${PYTHONPATH:+:$PYTHONPATH}
      "$PY" -c "import openvino as ov; print('openvino', ov.__version__, ov.Core().available_devices)"
      ;;
    real)
      mkdir -p "$BG/real"
      if [ -f .device-snapshots/real-state.tar.gz ] && [ ! -f "$BG/real/state.tar.gz" ]; then
        cp .device-snapshots/real-state.tar.gz "$BG/real/state.tar.gz"
      fi
      real_sets
      setsid nohup "$PY" benchmarks/real_result.py --spec examples/cropfollow-resnet18.yaml --estimator ekf \
        "${sets[@]}" --out "$BG/real" --state "$BG/real/state.tar.gz" --json "$BG/real/real_result.json" \
        >> "$BG/real.log" 2>&1 < /dev/null &
      echo "real: started (${sets[*]})"
      ;;
    merge-resnet18)
      # Each order of the ResNet-18 spec's merge group, distilled on the GPU for each of $QAOPT_MERGE_STEPS, 48
      # closed-loop runs each on the cores (variants kept in $BG/merge: a later call resumes), in the background.
      mkdir -p "$BG/merge"
      # Lengths outer, orders inner: both orders of the first length are measured before the next length starts.
      setsid nohup bash -c 'for steps in $1; do for order in "heading distance" "distance heading"; do
          "$0" benchmarks/merge_distillation.py --spec examples/cropfollow-resnet18.yaml --order $order \
            --steps $steps --runs 48 --workers "$(nproc)" --cache-dir "$2/merge/cache-${order// /-}" \
            --json "$2/merge/merge_distillation_resnet18_${order// /-}.json"
        done; done' "$PY" "${QAOPT_MERGE_STEPS:-3000 1200 300}" "$BG" >> "$BG/merge.log" 2>&1 < /dev/null &
      echo "merge-resnet18: started (steps ${QAOPT_MERGE_STEPS:-3000 1200 300})"
      ;;
    merge-adapt)
      # The merged NN of $QAOPT_MERGE_SPEC (default examples/cropfollow.yaml; its merge group as the spec sets it:
      # 3000 steps, backbone frozen), distilled on the GPU, in int8 at each scale:adaptation-steps[:pruning:fine-tuning
      # steps] of $QAOPT_MERGE_VARIANTS (default 0.5:160 0.5:480 0.5:1000), $QAOPT_MERGE_RUNS closed-loop runs each
      # (default 48) from seed $QAOPT_MERGE_SEED_BASE (default validation's selection seeds) on the cores; one cache per
      # spec, so the merged NN distils once and a later call resumes; in the background (poll; collect brings
      # merge/merge_adapt_<$QAOPT_MERGE_NAME>.json and merge.log).
      mkdir -p "$BG/merge"
      spec=${QAOPT_MERGE_SPEC:-examples/cropfollow.yaml}
      setsid nohup bash -c 'for v in $1; do
          IFS=: read -r scale adapt prune finetune <<< "$v"
          "$0" benchmarks/merge_distillation.py --spec "$6" --steps 3000 --scale "$scale" --adapt "$adapt" \
            --prune "${prune:-0}" --finetune "${finetune:-0}" --runs "$2" --seed-base "$3" --workers "$(nproc)" \
            --cache-dir "$4/merge/cache-adapt-$(basename "$6" .yaml)" --json "$4/merge/merge_adapt_$5.json"
        done' "$PY" "${QAOPT_MERGE_VARIANTS:-0.5:160 0.5:480 0.5:1000}" "${QAOPT_MERGE_RUNS:-48}" \
        "${QAOPT_MERGE_SEED_BASE:-5000000}" "$BG" "${QAOPT_MERGE_NAME:-0.5}" "$spec" >> "$BG/merge.log" 2>&1 < /dev/null &
      echo "merge-adapt: started ($spec: ${QAOPT_MERGE_VARIANTS:-0.5:160 0.5:480 0.5:1000}, ${QAOPT_MERGE_RUNS:-48} runs from seed ${QAOPT_MERGE_SEED_BASE:-5000000})"
      ;;
    fidelity)
      mkdir -p "$BG/fidelity"
      setsid nohup "$PY" benchmarks/fidelity_closed_loop.py --spec "${QAOPT_FIDELITY_SPEC:-examples/cropfollow.yaml}" \
        ${QAOPT_FIDELITY_ONLY:+--only "$QAOPT_FIDELITY_ONLY"} --variant-seed "${QAOPT_FIDELITY_SEED:-0}" --runs 48 \
        --workers "$(nproc)" --device cuda --cache-dir "$BG/fidelity-cache" --out "$BG/fidelity" \
        >> "$BG/fidelity.log" 2>&1 < /dev/null &
      echo "fidelity: started (${QAOPT_FIDELITY_ONLY:-every configuration}, variant seed ${QAOPT_FIDELITY_SEED:-0})"
      ;;
    scene-errors)
      mkdir -p "$BG/scene-errors"
      sets="${QAOPT_SCENE_SETS:-seed2 seed1}"
      setsid nohup bash -c 'for set in $0; do "$1" benchmarks/fidelity_scene_errors.py --closed-loop \
          "docs/benchmarks/fidelity_device/$set" --device cuda --workers "$(nproc)" --cache-dir "$2/fidelity-cache" \
          --out "$2/scene-errors/$set" $3; done' "$sets" "$PY" "$BG" "${QAOPT_SCENE_ARGS:-}" >> "$BG/scene-errors.log" 2>&1 < /dev/null &
      echo "scene-errors: started ($sets)"
      ;;
    scenes)
      real_sets
      state="$BG/real/state.tar.gz"; [ -f "$state" ] || state=.device-snapshots/real-state.tar.gz
      "$PY" benchmarks/scene_failures.py --state "$state" --spec examples/cropfollow-resnet18.yaml --estimator ekf \
        "${sets[@]}" --workers "$(nproc)" --reference --json "$OUT/scene_failures_resnet18.json" > "$OUT/scenes.log" 2>&1
      tail -30 "$OUT/scenes.log"
      ;;
    *) echo "unknown step '$step' (install, tests, quick, quick-bg, wait, latency, default-compact, default-resnet18,"\
            "progress, poll, restore, wait-default, collect, latency-compact, latency-resnet18, tvm-part, tvm-install,"\
            "reference-tvm, ov-install, real, scenes, merge-resnet18, merge-adapt, fidelity, scene-errors)"; exit 2 ;;
  esac
done
