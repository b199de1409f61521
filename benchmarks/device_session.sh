#!/usr/bin/env bash
# One lent accelerator session, one command: the machine's environment, the invariants on its
# device (decode = forward, ensemble member = lone run), benchmarks/gpu.py, and the two studies
# planned for an accelerator (experiments/quickstart.py:gpu, experiments/architectures.py:gpu).
#
#   benchmarks/device_session.sh [--smoke] [--out DIR] [--work DIR] [--budget SECONDS]
#
# Every stage writes its table into DIR ($OUT on a lent machine, else sweeps/device_session/out):
# env.json, checks.md, gpu.md, quickstart.csv + quickstart_report.txt, architectures.csv +
# architectures_report.txt and session.log (8 files: what the device tool brings back). A stage
# that finished is not rerun, and the studies resume, so a second call on the same warm machine
# finishes what the first left (work lives in --work, default sweeps/device_session/, which git
# ignores).
# --budget: seconds for the whole call (default 480); each study gets what is left of it.
# The studies come first, then the throughput benchmark, then the device checks: on the first
# lent H200 (2026-11-27, docs/results/device_h200_2026-11-27/) benchmarks/gpu.py at two batches
# and three ensemble sizes took 316 s of the 480, and on the second (device_h200_2026-11-27b/)
# the checks took 226 s; the quickstart study (40 runs, 4 workers) took about 6 minutes.
#
# On a lent machine, with its own image's jax, the packages the image lacks travel as wheels
# (benchmarks/device_wheels.sh, run here first; .whl/ is named in the run's carry):
#   device run  command='bash benchmarks/device_session.sh'  carry=['.whl']  timeout_s=560
# --smoke: CPU-sized stand-ins of every stage (experiments/tiny_isoflop.py for both studies, the
# scripts' own --smoke);
# the slow test lane runs it.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
SMOKE=0
BUDGET=480
OUTDIR=${OUT:-}
WORK=
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) SMOKE=1 ;;
    --out) OUTDIR=$2; shift ;;
    --out=*) OUTDIR=${1#--out=} ;;
    --work) WORK=$2; shift ;;
    --work=*) WORK=${1#--work=} ;;
    --budget) BUDGET=$2; shift ;;
    --budget=*) BUDGET=${1#--budget=} ;;
    *) echo "error: unknown argument $1 (see the top of $0)" >&2; exit 2 ;;
  esac
  shift
done
WORK=${WORK:-$REPO/sweeps/device_session$([ "$SMOKE" = 1 ] && echo _smoke)}
WORK=$(mkdir -p "$WORK" && cd "$WORK" && pwd)
OUTDIR=${OUTDIR:-$WORK/out}
mkdir -p "$WORK" "$OUTDIR"
START=$SECONDS
PY=${PYTHON:-python3}
LOG=$WORK/session.log

# The image's own jax/flax/optax/orbax stay; the wheels bring what it lacks. attnlab itself
# runs from the checkout (PYTHONPATH), so nothing is built there. A smoke run uses $PYTHON's.
if [ "$SMOKE" = 0 ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$REPO:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
ATTNLAB=("$PY" -m attnlab.cli)

say() { echo "[$((SECONDS - START)) s] $*" | tee -a "$LOG"; }
left() { echo $((BUDGET - (SECONDS - START))); }
publish() { cp -f "$WORK"/*.json "$WORK"/*.md "$WORK"/*.csv "$WORK"/*.txt "$LOG" "$OUTDIR"/ 2>/dev/null; true; }
# stage NAME COMMAND...: runs once; a stage that exits 0 is marked done and skipped next time.
stage() {
  local name=$1; shift
  if [ -e "$WORK/.done-$name" ]; then say "$name: done in an earlier call"; return 0; fi
  say "$name: $*"
  "$@" >>"$LOG" 2>&1
  local rc=$?
  [ $rc -eq 0 ] && touch "$WORK/.done-$name"
  say "$name: exit $rc"
  publish
  return 0
}
# study NAME EXPERIMENT: `attnlab quickstart` on it (the sweep, every fit with intervals, the
# report), stopped by SIGTERM when the budget runs out (it resumes next call); its results
# table and report are published.
study() {
  local name=$1 experiment=$2 seconds
  seconds=$(left)
  if [ "$seconds" -lt 30 ]; then say "$name: no time left this call; run me again"; return; fi
  stage "$name" bash -c "timeout --signal=TERM --kill-after=30 $seconds ${ATTNLAB[*]} \
      quickstart --config=$experiment --sweep='$WORK/$name' --parallel=$PARALLEL \
      --bootstrap=$BOOTSTRAP --noprogress > '$WORK/${name}_report.txt'"
  cp -f "$WORK/$name/results.csv" "$WORK/$name.csv" 2>/dev/null
  publish
}

# timed NAME SECONDS COMMAND...: a stage that needs about SECONDS (measured on an H200), run
# only when that much of the budget is left.
timed() {
  local name=$1 needs=$2; shift 2
  if [ -e "$WORK/.done-$name" ] || [ "$(left)" -ge "$needs" ]; then stage "$name" "$@"
  else say "$name: needs ~$needs s, $(left) s left; run me again"; fi
}

say "device session: smoke=$SMOKE budget=${BUDGET}s work=$WORK out=$OUTDIR"
stage env bash -c "${ATTNLAB[*]} env --json='$WORK/env.json'"
if [ "$SMOKE" = 1 ]; then
  PARALLEL=1 BOOTSTRAP=8
  stage checks "$PY" benchmarks/device_checks.py --smoke --out "$WORK/checks.md"
  study quickstart experiments/tiny_isoflop.py
  study architectures experiments/tiny_isoflop.py
  stage gpu bash -c "$PY benchmarks/gpu.py --smoke --ks 1,2 > '$WORK/gpu.md'"
else
  PARALLEL=4 BOOTSTRAP=200
  study quickstart experiments/quickstart.py:gpu
  study architectures experiments/architectures.py:gpu
  timed gpu 150 bash -c "$PY benchmarks/gpu.py --batch 32 --ks 1,16 > '$WORK/gpu.md'"
  timed checks 240 "$PY" benchmarks/device_checks.py --out "$WORK/checks.md"
fi
publish
missing=$(for s in env checks gpu quickstart architectures; do [ -e "$WORK/.done-$s" ] || echo -n "$s "; done)
say "stages not done: ${missing:-none}; results in $OUTDIR"
publish
[ -z "$missing" ]
