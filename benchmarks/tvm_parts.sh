#!/usr/bin/env bash
# TVM for the GPU machine, which has no TVM and no registry: its PyPI wheel (100 MB, more than one device call may
# carry beside the working tree) unpacked without CUTLASS's headers (TVM's own CUDA code generation does not include
# them), compressed with xz and split in two parts, one per call, with the wheels TVM needs that the machine lacks
# (cuda-bindings and cuda-pathfinder are there). Writes .tvm-parts/1 and .tvm-parts/2 (ignored by git); on the
# device, `benchmarks/gpu_device.sh tvm-part` keeps each call's part and `tvm-install` joins and unpacks them
# (docs/BENCHMARKS.md, "TVM's CUDA target").
#
#   bash benchmarks/tvm_parts.sh      # then, one device call each: carry .tvm-parts/1, then .tvm-parts/2
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx "/.tvm-parts/" .git/info/exclude 2>/dev/null || echo "/.tvm-parts/" >> .git/info/exclude
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$work/wheels" \
  apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post0 xgboost-cpu==3.2.0 cloudpickle==3.1.3 tornado==6.6.1 \
  ml_dtypes==0.6.0
unzip -q "$work"/wheels/apache_tvm-*.whl -d "$work/site" && rm "$work"/wheels/apache_tvm-*.whl
tar -C "$work/site" -cf - --exclude=tvm/3rdparty/cutlass . | xz -9e -T0 > "$work/tvm.tar.xz"
split -b 38M -d -a 1 "$work/tvm.tar.xz" "$work/tvm.tar.xz.part"
rm -rf .tvm-parts && mkdir -p .tvm-parts/1 .tvm-parts/2
mv "$work/tvm.tar.xz.part0" .tvm-parts/1/ && mv "$work/tvm.tar.xz.part1" "$work"/wheels/* .tvm-parts/2/
du -sh .tvm-parts/1 .tvm-parts/2
