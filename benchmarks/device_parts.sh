#!/usr/bin/env bash
# Engines for the device machine, which has neither TVM nor OpenVINO and no registry: each one's PyPI wheel for the
# machine's Python 3.12, unpacked without what qaopt never loads there, xz-compressed, with the wheels it needs that
# the machine lacks. A device call carries at most 64 MiB with the working tree (about 20 MB), so:
#
#   tvm       TVM 0.27 (100 MB wheel) without CUTLASS's headers (TVM's own CUDA code generation does not include
#             them), split in two parts, one per call: .tvm-parts/1 and .tvm-parts/2, then on the device
#             `gpu_device.sh tvm-part` in the first call and `tvm-part tvm-install` in the second
#             (docs/BENCHMARKS.md, "TVM's CUDA target")
#   wheels    what `pip install -e .` needs there beside the machine's own packages (optuna, pydantic, SQLAlchemy,
#             gymnasium, torch-pruning, mcap, ... and setuptools and wheel for pip's isolated build), at the versions
#             constraints.txt pins: .whl/ (about 17 MB), carried by every call that runs `gpu_device.sh install`
#   openvino  OpenVINO 2026.4 (59 MB wheel) without the GPU and NPU plugins and the TensorFlow, TF Lite, Paddle,
#             JAX and GGUF frontends (qaopt hands OpenVINO ONNX graphs and reads IR): .ov-parts/ (23 MB), carried
#             with .whl in one call, then `gpu_device.sh install ov-install` (docs/BENCHMARKS.md, "The real
#             result: ResNet-18 CropFollow on a pinned 2-thread CPU target")
#
#   bash benchmarks/device_parts.sh wheels tvm openvino
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# download WHEEL...: the wheels for the device machine's Python into $work/wheels.
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$work/wheels" "$@"
}

# The device image's packages (the device README's list) lack these of qaopt's requirements and their own, pinned
# as constraints.txt pins them; pip's isolated build of `-e .` also needs the build tools, which pip freeze leaves
# out of constraints.txt, so they are pinned here.
DEVICE_MISSING="torch-pruning optuna alembic colorlog Mako SQLAlchemy gymnasium Farama-Notifications pydantic
pydantic_core annotated-types typing-inspection typing_extensions mcap mcap-ros2-support lz4 zstandard"
BUILD_TOOLS="setuptools==84.2.1 wheel==0.48.0"

# pinned NAME: the line NAME==VERSION of constraints.txt.
pinned() {
  grep -i -m1 "^$1==" constraints.txt || { echo "device_parts.sh: constraints.txt pins no '$1'" >&2; exit 2; }
}

# unpack PREFIX: the wheel named PREFIX-*.whl unzipped into a fresh $work/site and removed from $work/wheels.
unpack() {
  rm -rf "$work/site" && unzip -q "$work"/wheels/"$1"-*.whl -d "$work/site" && rm "$work"/wheels/"$1"-*.whl
}

# ignored DIR: keep DIR out of git (the parts are rebuilt here, never committed).
ignored() {
  grep -qx "/$1/" .git/info/exclude 2>/dev/null || echo "/$1/" >> .git/info/exclude
}

for engine in "$@"; do
  rm -rf "$work/wheels"
  case $engine in
    wheels)
      ignored .whl
      specs=($BUILD_TOOLS)
      for name in $DEVICE_MISSING; do specs+=("$(pinned "$name")"); done
      rm -rf .whl && mkdir -p "$work/wheels" && download "${specs[@]}" && mv "$work/wheels" .whl
      du -sh .whl
      ;;
    tvm)
      ignored .tvm-parts
      download apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post0 xgboost-cpu==3.2.0 cloudpickle==3.1.3 \
        tornado==6.6.1 ml_dtypes==0.6.0
      unpack apache_tvm
      tar -C "$work/site" -cf - --exclude=tvm/3rdparty/cutlass . | xz -9e -T0 > "$work/tvm.tar.xz"
      split -b 38M -d -a 1 "$work/tvm.tar.xz" "$work/tvm.tar.xz.part"
      rm -rf .tvm-parts && mkdir -p .tvm-parts/1 .tvm-parts/2
      mv "$work/tvm.tar.xz.part0" .tvm-parts/1/ && mv "$work/tvm.tar.xz.part1" "$work"/wheels/* .tvm-parts/2/
      du -sh .tvm-parts/1 .tvm-parts/2
      ;;
    openvino)
      ignored .ov-parts
      download openvino==2026.4.1 openvino-telemetry==2025.2.0
      unpack openvino
      libs="$work/site/openvino/libs"
      rm -f "$libs"/libopenvino_intel_{gpu,npu}_plugin.so \
        "$libs"/libopenvino_{tensorflow,tensorflow_lite,paddle,jax,gguf}_frontend.so.*
      rm -rf .ov-parts && mkdir -p .ov-parts
      tar -C "$work/site" -cf - . | xz -9 -T0 > .ov-parts/openvino.tar.xz
      mv "$work"/wheels/* .ov-parts/
      du -sh .ov-parts
      ;;
    *) echo "unknown engine '$engine' (wheels, tvm, openvino)"; exit 2 ;;
  esac
done
