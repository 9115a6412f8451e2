#!/usr/bin/env bash
# Every GPU check in one call of at most ~8 minutes, for a machine with an NVIDIA GPU; results go to
# $OUT (default ./gpu_out): gpu_check.log (every step's output, in order: the gpu-marked tests of
# tests/test_gpu.py, the benches, trainer=fsdp killed and resumed from its sharded checkpoint, the fast
# suite last), doctor.json, tune.md (make tune's GPU knobs), benchtuned/bench.md, bench8/bench.md,
# benchgpt/bench.md (a 6-layer decoder-only transformer, experiment=sort_gpt made GPU-sized) and
# bench20/bench.md (+ .png), ops.txt and trace.json.gz (profiled steady-state steps); the data paths'
# samples/s (bench_data) are in the log.
# LitData (data=shards) is not on the lent machine: its tests skip there and bench_data leaves the
# streamed rows out.
#
# The lent H200 (../shared/gpu-notes.md) has torch, lightning, torchmetrics, rich, scikit-learn, pytest
# and pytest-xdist, and no network; hydra-core, omegaconf and antlr4 travel as wheels. Once, here:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 -d .whl hydra-core==1.3.8 omegaconf==2.3.1
#   python3 -m pip wheel --no-deps -w .whl antlr4-python3-runtime==4.9.3   # sdist only: build it here
# then, with the device tool: run(command="bash scripts/gpu_check.sh", carry=[".whl"], timeout_s=570).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
BUDGET=${BUDGET:-460}  # seconds for all the steps together: each step gets at most what is left
mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
LOG="$OUT/gpu_check.log"
: >"$LOG"
status=0
step() {  # step NAME LIMIT COMMAND...: run within min(LIMIT, budget left), log it, remember a failure
  local name=$1 limit=$2; shift 2
  local left=$((BUDGET - SECONDS))
  ((left < limit)) && limit=$left
  if ((limit < 10)); then echo "== $name: SKIPPED (time budget spent)" | tee -a "$LOG"; status=1; return; fi
  echo "== $name (${limit}s at most, ${SECONDS}s in): $*" | tee -a "$LOG"
  if ! timeout "$limit" "$@" >>"$LOG" 2>&1; then echo "   FAILED: $name" | tee -a "$LOG"; status=1; fi
}
# The package and the missing dependencies go into the system environment (subprocesses and the
# tests' `run_module`, which replaces PYTHONPATH, see them too); nothing is downloaded.
if [ -d .whl ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile .whl/*.whl 2>&1 | tail -2 | tee -a "$LOG"
fi
echo "$PWD/src" >"$("$PY" -c 'import site; print(site.getsitepackages()[0])')/lightspeed-dev.pth"
XDIST=$("$PY" -c 'import xdist' 2>/dev/null && echo "-n 12")
BENCH=(data=synthetic model=resnet data.num_samples=50000 data.batch_size=512)
WIDE=(model.net.widths=[64,128,256] model.net.blocks_per_stage=3)
DIGITS=(trainer=gpu paths.log_dir=/tmp/gpu_logs)
# The transformer at a size a GPU notices: 6 layers, 384 wide (10.7M parameters), 127 tokens a sequence
GPT=(experiment=sort_gpt model.net.n_layer=6 model.net.n_head=6 model.net.n_embd=384 data.length=64
  data.num_digits=10 data.num_samples=50000 data.batch_size=256)

# In order of what the GPU throughput targets need; a step that the budget no longer covers is skipped.
step versions 30 bash -c "date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; \
  $PY -c 'import torch, lightning, hydra, lightspeed; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \
  \"lightning\", lightning.__version__, \"hydra\", hydra.__version__, \"lightspeed from\", lightspeed.__file__)'"
step doctor 45 "$PY" -m lightspeed.doctor --json "$OUT/doctor.json"
# the gpu-marked tests: sync debug mode `error` in steady steps, no recompile under inductor, channels_last
# and bf16 in effect (tests/test_gpu.py)
step gpu_tests 90 "$PY" -m pytest -q -m gpu -p no:cacheprovider -rA tests/test_gpu.py
# bench.md is rewritten after every configuration's run: a bench cut short still leaves its table. A run is
# ~25-30 s there whatever its --steps (start-up, warm-up), so one round (2026-12-04: 5 runs took over 150 s)
step bench_resnet8 190 "$PY" -m lightspeed.bench --steps 200 --repeats 1 --out "$OUT/bench8" \
  --configs hand+off,off,hand,default,hand+max,max "${BENCH[@]}"
# the small-model case: a whole 20-epoch fit of the default CNN on digits against a plain loop on the same loaders
step small_fit 60 "$PY" scripts/bench_small_fit.py --epochs 20 --repeats 3 trainer=gpu
step bench_gpt 130 "$PY" -m lightspeed.bench --steps 100 --repeats 1 --out "$OUT/benchgpt" \
  --configs hand+off,off,hand,default,hand+max,max "${GPT[@]}"
# make tune's GPU knobs (pinned memory, cuDNN autotuning, compile modes, workers) on the bench ResNet, then
# accel=tuned against accel=default side by side (tune.md and benchtuned/bench.md come back)
step tune 170 bash -c "$PY -m lightspeed.tune ${BENCH[*]} tune.budget_s=150 tune.steps=50 tune.repeats=2 \
  && cp logs/tune/*/tune.md $OUT/tune.md"
step bench_tuned 80 "$PY" -m lightspeed.bench --steps 100 --repeats 1 --out "$OUT/benchtuned" \
  --configs default,tuned "${BENCH[@]}"
step train_max 70 "$PY" -m lightspeed.train "${DIGITS[@]}" accel=max
# trainer=fsdp, one process: killed after its first sharded checkpoint, resumed to an uninterrupted run's weights
step fsdp 90 "$PY" -m pytest -q -m gpu -p no:cacheprovider -rA tests/test_sharded.py
step profile_default 45 "$PY" scripts/profile_steps.py --out "$OUT" --skip 40 --steps 5 trainer=gpu "${BENCH[@]}"
[ -f "$OUT/trace.json" ] && gzip -f "$OUT/trace.json"  # ~10x smaller; Perfetto (ui.perfetto.dev) opens it
step bench_data 60 "$PY" scripts/bench_data.py --device cuda --repeats 3 --workers 0,1,4
step bench_resnet20_wide 90 "$PY" -m lightspeed.bench --steps 100 --repeats 1 --out "$OUT/bench20" \
  --configs hand,default,hand+max,max "${BENCH[@]}" "${WIDE[@]}"
# the fast suite on the GPU last: it is CI's on a CPU (2026-12-04: not done in 120 s with 12 workers)
step tests 150 "$PY" -m pytest -q -m "not slow and not gpu" -p no:cacheprovider $XDIST tests
rm -rf "$OUT"/bench*/runs  # the per-run folders stay on the machine; the tables come back
grep -E "^== |FAILED|SKIPPED|passed|failed|^\| |recompil|data.on_device" "$LOG" | tail -n 90
exit $status
