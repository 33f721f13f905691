#!/usr/bin/env bash
# The checks medjax runs where an NVIDIA GPU is lent (CI has none): one script, one call.
#
#   bash experiments/gpu_checks.sh OUTDIR [DEADLINE_S]
#
# Run from the repository root on the GPU machine. Where the machine lacks packages that
# requirements.txt pins, carry them as Python 3.12 wheels in .whl/ (`bash
# experiments/gpu_wheels.sh` fills it here; the GPU image's own jax and its CUDA plugin are used:
# jaxlib and the CUDA libraries are too big to carry; so is its flax, since flax 0.12.8 does not
# import on jax 0.11). Stages, each
# logged to OUTDIR and skipped once DEADLINE_S (default 480) seconds have passed (STAGES, a
# space-separated list, picks some):
#   env        the GPU, driver and library versions, what medjax's layout sees
#   loop       experiments.bench_loop on configs/paper.py (batch 512, 6,000 patients, 2 partitions
#              an epoch so that each holds several steps, 60 epochs: ~600 steps, long enough for
#              the writers' rests to matter): the real loop with the default checkpoint policy
#              beside the in-memory step, float32 then bfloat16, then bfloat16 with 2 steps in
#              flight (the default before 2026-12-01; 4 on an accelerator now) and with writers
#              that never rest (ckpt.writer_duty=1, the policy before it); the model's TFLOP/s
#              beside the chip's peak (issue 33)
#   train      (not by default: `loop` reports the TFLOP/s) experiments.bench_train's FLOP/s part
#              on configs/paper.py at batch 512, float32 and bfloat16
#   startup    experiments.bench_data --config paper (2,000 patients, the paper's 64-px images): the
#              cache fill's records/s in one process and on every core, the writing process's CPU
#              a record, how many cores one process per core gets at once, a 16-process pool's
#              start, and the fill on 16 simulated decoding processes (what it costs beyond
#              decoding). Synthetic cohorts are written on every core since 2026-11-29; the
#              `loop` stage's first data setup (63 s on 2026-11-27) wrote its 6,000 patients
#              in one process
#   precision  the quickstart in float32 and in bfloat16 on one salt (the same split): test accuracy
#              and macro F1 of each (model.dtype='auto' picks bfloat16 on a GPU)
#   tiny       the tests' tiny config end to end, supervised, in the auto layout (one worker
#              process per GPU), on the GPU
#   probe      experiments.live_devices_probe on the GPU(s) (issue 12, item 6)
#   recovery   experiments.bench_recovery: three faults on the quickstart (part B, auto
#              layout), then supervised vs unsupervised (part A, one repeat); RECOVERY_ARGS
#              replaces those arguments, RECOVERY_LIMIT (seconds) the stage's limit
# The workdirs' logs, events and summaries end up in OUTDIR/runs.tgz. The device tool brings back
# at most 8 files: run it as `bash experiments/gpu_checks.sh /tmp/g; tar czf $OUT/gpu.tgz -C /tmp g`.
#
# A rehearsal on a CPU host (no GPU: every stage's commands, at small sizes, so that a lent GPU's
# minutes are not spent on a broken command): `REHEARSAL=1 bash experiments/gpu_checks.sh OUTDIR
# 1200`; the GPU-only probe is skipped, and each stage must end with rc=0 in OUTDIR/stages.txt.
set -u
out=${1:?usage: gpu_checks.sh OUTDIR [DEADLINE_S]}
deadline=${2:-480}
rehearsal=${REHEARSAL:-0}
# The loop's and the startup's cohorts (patients, epochs): the GPU's sizes, or a rehearsal's.
if (( rehearsal )); then
  platform=cpu loop_patients=300 loop_epochs=2 startup_patients=300 train_patients=200
  loop_small="--set data.batch_size=32 --rounds 1" train_batch=32   # the paper's model on 2 cores
else
  platform=cuda loop_patients=6000 loop_epochs=60 startup_patients=2000 train_patients=1500
  loop_small="" train_batch=512
fi
mkdir -p "$out"
start=$SECONDS
left() { echo $(( deadline - (SECONDS - start) )); }
stage() {  # stage NAME SECONDS COMMAND...: runs COMMAND under a timeout, if there is time
  local name=$1 limit=$2; shift 2
  if [[ " ${STAGES:-env loop startup precision tiny} " != *" $name "* ]]; then return 0; fi
  local budget; budget=$(left)
  if (( budget < 20 )); then echo "$name: skipped (deadline)" | tee -a "$out/stages.txt"; return 1; fi
  (( limit > budget )) && limit=$budget
  local t0=$SECONDS
  timeout -k 5 "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc in $(( SECONDS - t0 )) s (limit $limit s)" | tee -a "$out/stages.txt"
  return $rc
}

export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  wheels() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$@" >> "$out/pip.log" 2>&1; }
  if ! wheels .whl/*.whl; then   # one wheel this machine cannot take must not cost the others
    for w in .whl/*.whl; do
      wheels "$w" || echo "pip: $w not installed" | tee -a "$out/stages.txt"
    done
  fi
  export PYTHONPATH=/tmp/site
fi

stage env 60 bash -c '
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  ls /proc/driver/nvidia/gpus /dev/nvidia* 2>&1 | head
  nproc; free -g | head -2; grep -m1 "model name" /proc/cpuinfo; df -hT /tmp | tail -1
  cat /sys/fs/cgroup/cpu.max /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2> /dev/null
  python3 - <<EOF
import importlib.metadata as md
for name in ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "optax",
             "orbax-checkpoint", "tensorstore", "grain", "pandas", "numpy", "grpcio", "protobuf",
             "pydicom", "optuna", "nvidia-ml-py"):
  try:
    print(name, md.version(name))
  except md.PackageNotFoundError:
    print(name, "absent")
import jax
print("devices", jax.devices())
from medjax.fault import layout
print("layout accelerators", layout.accelerators())
EOF'

export JAX_PLATFORMS=$platform
loop_args="--config paper --patients $loop_patients --epochs $loop_epochs \
  --set data.num_partitions=2 --no-profile --workdir /tmp/gpu_loop $loop_small"
# shellcheck disable=SC2086  (loop_args is a list of arguments)
stage loop 330 bash -c "python3 -m experiments.bench_loop $loop_args --set model.dtype=float32 \
    --out $out/bench_loop_f32.json \
  && python3 -m experiments.bench_loop $loop_args --set model.dtype=bfloat16 \
       --out $out/bench_loop_bf16.json \
  && python3 -m experiments.bench_loop $loop_args --set model.dtype=bfloat16 \
       --set max_steps_in_flight=2 --out $out/bench_loop_bf16_inflight2.json \
  && python3 -m experiments.bench_loop $loop_args --set model.dtype=bfloat16 \
       --set ckpt.writer_duty=1.0 --out $out/bench_loop_bf16_duty1.json"
train_args="--config paper --patients $train_patients --batch-sizes $train_batch --parts flops \
  --rounds 5"
stage train 120 bash -c "python3 -m experiments.bench_train $train_args --set model.dtype=float32 \
    --out $out/bench_train_f32.json \
  && python3 -m experiments.bench_train $train_args --set model.dtype=bfloat16 \
    --out $out/bench_train_bf16.json"
stage startup 150 python3 -m experiments.bench_data --config paper --patients $startup_patients \
  --batches 5 --one-process-records 300 --out "$out/bench_data.json"
rm -rf /tmp/gpu_p32 /tmp/gpu_p16
stage precision 150 bash -c "python3 launch.py --config configs/quickstart.py --workdir /tmp/gpu_p32 \
    --config.model.dtype=float32 --config.fault.supervised=False \
  && cp /tmp/gpu_p32/summary.json $out/precision_f32.json \
  && python3 launch.py --config configs/quickstart.py --workdir /tmp/gpu_p16 \
    --config.model.dtype=bfloat16 --config.fault.supervised=False \
    --config.data.salt_file=/tmp/gpu_p32/secrets/id_salt \
  && cp /tmp/gpu_p16/summary.json $out/precision_bf16.json"
rm -rf /tmp/gpu_tiny
stage tiny 180 python3 launch.py --config configs/quickstart.py:tiny --workdir /tmp/gpu_tiny
tiny=$?
if (( ! rehearsal )); then
  (unset JAX_PLATFORMS; stage probe 60 python3 -m experiments.live_devices_probe --platform gpu \
    --processes 2 --timeout-s 45 --out "$out/live_devices_gpu.json")
fi

if (( tiny == 0 )); then
  # shellcheck disable=SC2086  (RECOVERY_ARGS is a list of arguments)
  stage recovery "${RECOVERY_LIMIT:-400}" python3 -m experiments.bench_recovery \
    ${RECOVERY_ARGS:---parts B,A --layouts auto --repeats 1} --out "$out/recovery_gpu.json"
fi

# What the runs left, without the cohorts, ingests, checkpoints and compilation caches.
tar czf "$out/runs.tgz" --exclude='*/cohort' --exclude='*/ingest' --exclude='*/cache' \
  --exclude='*/ckpt' --exclude='*/jax_cache' --exclude='*/lineage' --exclude='*/ledger' \
  --exclude='*/tensorboard' --exclude='*/secrets' \
  /tmp/gpu_tiny /tmp/bench_recovery_* 2> /dev/null
echo "total $(( SECONDS - start )) s" | tee -a "$out/stages.txt"
