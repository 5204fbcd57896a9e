#!/usr/bin/env bash
# The GPU checks of issue 38, run on a lent device from the repository root, in two parts
# that each fit one call (see /work/.library/device/README.md):
#
#   here:   maturin build --release -o .whl && pip download (torchrl 0.12.0, tensordict
#           0.12.4, gymnasium, ... for cp312) -d .whl     # .whl/ is ignored: carry it
#   device: bash benchmarks/gpu/device_check.sh tests     # GPU tests + cluster NCCL + demos
#           bash benchmarks/gpu/device_check.sh bench     # benchmarks.gpu.compare (+ huge pages)
#           bash benchmarks/gpu/device_check.sh again     # kernel checks, cluster NCCL, profile_paths
#           bash benchmarks/gpu/device_check.sh ab        # tests, then an A/B of the small-sample paths:
#                   old = .ab/old/reprise (git archive of the base commit's python/reprise, ignored:
#                   carry it), new = the wheel; then TorchRL's side and cluster NCCL
#
# Every step has its own timeout; logs and JSON go to $OUT (or benchmarks/out).
set -u
OUT=${OUT:-benchmarks/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
python3 -c "import reprise, torch, torchrl, triton; print('reprise', reprise.__file__, 'torch', torch.__version__, 'torchrl', torchrl.__version__, 'triton', triton.__version__)"
step() { local t=$1; shift; local s=$(date +%s); echo "=== $* (limit ${t}s)"; timeout "$t" "$@"; echo "=== rc $? after $(( $(date +%s) - s ))s"; }

case "${1:-tests}" in
tests)
  step 170 python3 -m pytest -q -p no:warnings -p no:cacheprovider -rfE --timeout 120 \
      tests/test_gpu.py tests/test_static.py tests/test_resident.py tests/test_sum_tree_kernels.py \
      tests/test_huge_pages.py tests/test_device_cpu.py tests/test_gpu_demo.py \
      "tests/test_docs.py" -k "not test_docs or cuda" 2>&1 | tee "$OUT/tests.log" | tail -60
  step 60 python3 -m benchmarks.gpu.cluster_nccl --rows 400,4096 --batches 256,4096 --bytes 4e8 \
      --out "$OUT/cluster_nccl.json" 2>&1 | tail -20
  step 45 python3 -m reprise.cli demo gpu --time-limit 30 --out /tmp/demo_gpu 2>&1 | tail -15
  step 45 python3 -m reprise.cli demo apex --time-limit 35 --out /tmp/demo_apex 2>&1 | tail -12
  step 60 python3 -m reprise.cli demo offline --smoke --out /tmp/demo_offline 2>&1 | tail -12
  for d in gpu apex offline; do cp /tmp/demo_$d/summary.json "$OUT/demo_$d.json" 2>/dev/null || echo "no summary for $d"; done
  ;;
bench)
  step 40 python3 -m benchmarks.async_rl.gpu_packed --out "$OUT/gpu_packed.json" 2>&1 | tail -5
  step 250 python3 -m benchmarks.gpu.compare --budget 190 --rows 400,4096,409600 --out "$OUT/gpu.json" 2>&1 | tail -45
  mkdir -p /mnt/huge && (mount -t tmpfs -o huge=within_size,size=8G tmpfs /mnt/huge 2>&1 || true)
  step 70 python3 -m benchmarks.gpu.compare --only memcpy,collect --no-peers --rows 4096 --batches 1024,4096 \
      --huge-dir /mnt/huge --budget 50 --out "$OUT/gpu-huge.json" 2>&1 | tail -20
  ;;
again)  # after the fixes of the first two parts: what failed, the cluster path, and the profile
  step 150 python3 -m pytest -q -p no:warnings -p no:cacheprovider -rfE --timeout 120 -k "triton or kernels" \
      tests/test_resident.py tests/test_sum_tree_kernels.py 2>&1 | tail -15
  step 60 python3 -m benchmarks.gpu.cluster_nccl --rows 400,4096 --batches 256,4096 --bytes 4e8 \
      --out "$OUT/cluster_nccl.json" 2>&1 | tail -20
  step 90 python3 -m benchmarks.gpu.profile_paths --out "$OUT" 2>&1 | tee "$OUT/profile.log" | head -40
  ;;
ab)
  step 150 python3 -m pytest -q -n 4 -p no:warnings -p no:cacheprovider -rfE --timeout 120 \
      tests/test_gpu.py tests/test_static.py tests/test_resident.py tests/test_sum_tree_kernels.py \
      tests/test_device_cpu.py tests/test_distributed.py "tests/test_docs.py" \
      -k "(not test_docs or cuda) and (not test_distributed or same_host)" 2>&1 | tee "$OUT/tests.log" | tail -40
  cp /tmp/site/reprise/_native.abi3.so .ab/old/reprise/
  ab() {  # side, then profile_paths' arguments
    local side=$1; shift
    if [ "$side" = old ]; then PYTHONPATH=$PWD/.ab/old:/tmp/site:$PWD step 45 python3 -m benchmarks.gpu.profile_paths \
        --medians-only --label "old " "$@" 2>&1 | grep -E "^  |Error|error" | tee -a "$OUT/ab.log"
    else step 45 python3 -m benchmarks.gpu.profile_paths --medians-only --label "new " "$@" 2>&1 \
        | grep -E "^  |Error|error" | tee -a "$OUT/ab.log"; fi
  }
  small="--repeats 1000 --variants host_selection,resident,device_store,device_store_resident"
  large="--repeats 300 --row-bytes 4096 --batch 4096 --items 262144 --variants host_selection,device_store,device_store_resident"
  ab old $small; ab new $small; ab old $small; ab new $small
  ab old $large; ab new $large
  step 80 python3 -m benchmarks.gpu.compare --only latency,device --rows 4096 --batches 1024,4096 --budget 70 \
      --out "$OUT/gpu.json" 2>&1 | tail -14
  step 45 python3 -m benchmarks.gpu.cluster_nccl --rows 400,4096 --batches 256,4096 --bytes 2e8 \
      --out "$OUT/cluster_nccl.json" 2>&1 | tail -12
  ;;
diag)  # (2026-11-28) the same-host CUDA test with its ranks' output, gather variants, where resident draws spend
  PYTHONFAULTHANDLER=1 step 75 python3 -m pytest -x -s -q -p no:warnings -p no:cacheprovider --timeout 70 \
      tests/test_distributed.py -k "same_host and local" 2>&1 | tee "$OUT/same_host.log" | grep -v "^E  " | tail -60
  step 60 python3 -m benchmarks.gpu.gather_variants --repeats 200 2>&1 | tail -20
  step 40 python3 -m benchmarks.gpu.profile_paths --repeats 300 --variants resident,device_store_resident --out "$OUT" \
      2>&1 | grep -E "^  |rror"
  mkdir -p "$OUT/4k"
  step 45 python3 -m benchmarks.gpu.profile_paths --repeats 200 --row-bytes 4096 --batch 4096 --items 262144 \
      --variants device_store,device_store_resident --label "4k " --out "$OUT/4k" 2>&1 | grep -E "^  |rror"
  step 40 python3 -m benchmarks.gpu.compare --only latency --budget 30 --out "$OUT/gpu.json" 2>&1 | grep -E "^\| lat|^\| static|rror"
  ;;
graphs)  # (2026-11-28) resident draws replayed from CUDA graphs: checked, timed; the same-host hang's stacks
  step 60 python3 tests/triton_kernels_check.py 2>&1 | tail -8
  step 40 python3 -m benchmarks.gpu.profile_paths --medians-only --repeats 500 \
      --variants host_selection,resident,device_store_resident 2>&1 | grep -E "^  |rror"
  step 30 python3 -m benchmarks.gpu.profile_paths --medians-only --repeats 200 --row-bytes 4096 --batch 4096 \
      --items 262144 --variants device_store_resident --label "4k " 2>&1 | grep -E "^  |rror"
  step 70 python3 -m pytest -x -q -p no:warnings -p no:cacheprovider --timeout 68 tests/test_distributed.py \
      -k "same_host and local" 2>&1 | tee "$OUT/same_host.log" | grep -E "File|Thread|passed|failed" | head -70
  ;;
esac
