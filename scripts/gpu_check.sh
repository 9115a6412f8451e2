#!/usr/bin/env bash
# Every GPU check in one call, for a machine with an NVIDIA GPU; results go to $OUT (default ./gpu_out).
#
# On the project's lent H200 (see the device tool's README) torch, lightning, torchmetrics, rich and
# scikit-learn are installed; hydra-core, omegaconf and antlr4 travel as wheels. Once, here:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     -d .whl hydra-core==1.3.8 omegaconf==2.3.0
#   python3 -m pip wheel --no-deps -w .whl antlr4-python3-runtime==4.9.3   # sdist only: build it here
# then run with carry=[".whl"]:  bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PY:-python3}
LOG="$OUT/gpu_check.log"  # every step's output, in order (the device tool returns at most 8 files)
: >"$LOG"
status=0
step() {  # step NAME COMMAND...: run with a time limit, append its output to the log, remember a failure
  local name=$1; shift
  echo "== $name: $*" | tee -a "$LOG"
  if ! timeout "${STEP_TIMEOUT:-240}" "$@" >>"$LOG" 2>&1; then echo "   FAILED: $name" | tee -a "$LOG"; status=1; fi
}
step env bash -c "date -u; nvidia-smi; $PY -c 'import torch, lightning; print(torch.__version__, torch.version.cuda, lightning.__version__)'"
step doctor "$PY" -m lightspeed.doctor --json "$OUT/doctor.json"
step tests "$PY" -m pytest -q -x -m "not slow" -p no:cacheprovider tests
step train_gpu "$PY" -m lightspeed.train trainer=gpu paths.log_dir=/tmp/gpu_logs
step train_max "$PY" -m lightspeed.train trainer=gpu accel=max paths.log_dir=/tmp/gpu_logs
step eval_gpu "$PY" -m lightspeed.eval trainer=gpu paths.log_dir=/tmp/gpu_logs
step bench_data "$PY" scripts/bench_data.py --device cuda
step bench_hotpath "$PY" scripts/bench_hotpath.py --device cuda   # fused vs foreach AdamW: decides optimizer_impl=auto
step bench "$PY" -m lightspeed.bench --steps 300 --warmup 50 --out /tmp/gpu_bench data=synthetic model=resnet \
  data.num_samples=50000 data.batch_size=512
cp /tmp/gpu_bench/bench.md /tmp/gpu_bench/bench.png "$OUT/" 2>/dev/null
grep -E "^== |FAILED|passed|failed|^\|" "$LOG" | tail -n 80
exit $status
