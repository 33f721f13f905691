#!/usr/bin/env bash
# Fills .whl/ with the wheels experiments/gpu_checks.sh installs on the GPU machine (which has
# Python 3.12, its own jax, jaxlib, CUDA plugin, flax, NumPy and TensorStore, and no PyPI), at
# requirements.txt's versions. Run it here before the device call, and carry .whl with it (the
# device tool's `carry: [".whl"]`, about 40 MB of its 64 MiB):
#
#   bash experiments/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# What the GPU image lacked on 2026-11-26 (or had at other versions); the rest of what these need
# (absl-py, etils, msgpack, ...) comes with the image's flax and jax.
names="ml-collections pydicom optuna alembic Mako colorlog sqlalchemy grain array_record
  tensorboardX optax orbax-checkpoint protobuf grpcio pandas nvidia-ml-py psutil tqdm tzdata
  portpicker pylibjpeg pylibjpeg-libjpeg pylibjpeg-openjpeg pylibjpeg-rle pyjpegls"
pins=()
for name in $names; do
  pin=$(grep -i -m1 "^${name}==" requirements.txt | cut -d' ' -f1) \
    || { echo "gpu_wheels: $name is not pinned in requirements.txt" >&2; exit 2; }
  pins+=("$pin")
done
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --dest .whl "${pins[@]}" \
  2>&1 | sed "/^WARNING: Location/d"
du -sh .whl
