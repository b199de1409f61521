#!/usr/bin/env bash
# One lent accelerator session, one command: the machine's environment, the studies planned for an
# accelerator, benchmarks/gpu.py, and the invariants on its device (decode = forward, ensemble
# member = lone run).
#
#   benchmarks/device_session.sh [--smoke] [--out DIR] [--work DIR] [--budget SECONDS]
#                                [--corpus ARCHIVE] [--resume ARCHIVE] [--override STAGE:KEY=VALUE]
#                                [--stages "quickstart_tuned quickstart regression gpu hparams
#                                           architectures checks"]
#
# Every stage writes its table into DIR ($OUT on a lent machine, else sweeps/device_session/out):
# env.json, quickstart_tuned.csv + quickstart_tuned_report.txt, quickstart.csv +
# quickstart_report.txt, hparams.csv, gpu.md, architectures.csv + architectures_report.txt,
# checks.md, session.log and runs.tar.gz. The device tool brings back 8 files, so --stages picks
# what one lease runs (default: quickstart_tuned gpu hparams; a study takes whatever the budget
# has left, so the grid comes last and resumes in a second call).
# quickstart_tuned: experiments/quickstart.py:gpu_tuned, the quickstart with every point at the
# rule's rate times 1 .. 8 (one ensemble per point's rates and seeds), fitted at each point's
# best rate; quickstart: the untuned plan, already run on three lent H200s.
# --corpus ARCHIVE (default .corpus/pystdlib.tar.xz, made here by benchmarks/device_corpus.py and
# named in the run's carry): the isoflop studies train on this machine's standard library,
# unpacked there, as data.source=text_files. Without it they read the lent machine's own
# pystdlib, a third of this one's (docs/benchmarks.md, "Third lent session"), and their plans'
# sweep.max_epochs = 1 refuses them before training. A stage that finished is
# not rerun, and the studies resume, so a second call on the same warm machine finishes what the
# first left (work lives in --work, default sweeps/device_session/, which git ignores).
# A fresh machine starts bare, so every call also brings back runs.tar.gz, the finished runs of
# its sweeps (benchmarks/device_runs.py); --resume ARCHIVE (default .resume/runs.tar.gz: copy
# the last lease's there and name .resume in the run's carry) puts them in --work first, and
# the studies train only what is left.
# --budget: seconds for the whole call (default 480); each study gets what is left of it.
# --override STAGE:KEY=VALUE (repeatable): a config override for one study or grid stage, e.g.
# quickstart_tuned:sweep.budgets=(1e13,2e13) trains only those budgets' runs. A plan's runs keep
# their ids under such a restriction, so a lease can finish what an earlier lease left when its
# runs did not come back, and the two tables are fitted together here (attnlab fit
# --sweep=A.csv,B.csv).
# Measured on lent H200s (docs/results/device_h200_2026-11-27*/): the quickstart study (42 runs,
# 4 workers) about 6 minutes with its fits; benchmarks/gpu.py at one batch and two ensemble sizes
# about 150 s; the checks about 230 s; the architecture study 25 of its 85 runs in 230 s, more
# than one lease holds (a fresh machine starts its sweep from nothing).
# hparams: the hyperparameter grid (experiments/hparams.py:gpu_refined, 120 runs in 24 ensembles)
# is swept there and fitted here from its table (attnlab fit --law=hparams --sweep=hparams.csv).
# regression: experiments/regression_seeds.py (the in-context regression known answer at seeds
# 0-2, one ensemble; 7.6 h on the 2-core CPU, done there: docs/icl.md), then `attnlab icl
# --sweep` on it: regression.csv (the sweep's table) and regression_icl.json (error per k beside
# every baseline, per run).
#
# On a lent machine, with its own image's jax, the packages the image lacks travel as wheels
# (benchmarks/device_wheels.sh, run here first; .whl/ is named in the run's carry):
#   device run  command='bash benchmarks/device_session.sh --budget 500'
#               carry=['.whl', '.corpus', '.resume']
#               timeout_s=570, then at once the same with --budget (what is left - 40 s)
# --smoke: CPU-sized stand-ins of every stage (experiments/tiny_isoflop.py for the isoflop studies,
# experiments/tiny_grid.py for the grid, the scripts' own --smoke); the slow test lane runs it.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
SMOKE=0
BUDGET=480
OUTDIR=${OUT:-}
WORK=
CORPUS=.corpus/pystdlib.tar.xz
RESUME=.resume/runs.tar.gz
STAGES="quickstart_tuned gpu hparams"
declare -A OVERRIDES=()
override() {  # STAGE:KEY=VALUE -> OVERRIDES[STAGE] gains --config.KEY=VALUE, quoted for bash -c
  local stage=${1%%:*} setting=${1#*:}
  if [ "$stage" = "$1" ] || [ "${setting%%=*}" = "$setting" ] || [ -z "${setting%%=*}" ]; then
    echo "error: --override $1: expected STAGE:KEY=VALUE" >&2; exit 2
  fi
  case " quickstart_tuned quickstart regression hparams architectures " in
    *" $stage "*) ;;
    *) echo "error: --override $1: $stage is not a study or grid stage" >&2; exit 2 ;;
  esac
  OVERRIDES[$stage]+=" $(printf %q "--config.$setting")"
}
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) SMOKE=1 ;;
    --out) OUTDIR=$2; shift ;;
    --out=*) OUTDIR=${1#--out=} ;;
    --work) WORK=$2; shift ;;
    --work=*) WORK=${1#--work=} ;;
    --budget) BUDGET=$2; shift ;;
    --budget=*) BUDGET=${1#--budget=} ;;
    --corpus) CORPUS=$2; shift ;;
    --corpus=*) CORPUS=${1#--corpus=} ;;
    --resume) RESUME=$2; shift ;;
    --resume=*) RESUME=${1#--resume=} ;;
    --stages) STAGES=$2; shift ;;
    --stages=*) STAGES=${1#--stages=} ;;
    --override) override "$2"; shift ;;
    --override=*) override "${1#--override=}" ;;
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
publish() {
  cp -f "$WORK"/*.json "$WORK"/*.md "$WORK"/*.csv "$WORK"/*.txt "$LOG" "$OUTDIR"/ 2>/dev/null
  "$PY" benchmarks/device_runs.py pack "$WORK" "$OUTDIR/runs.tar.gz" >/dev/null; true
}
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
      quickstart --config=$experiment --sweep='$WORK/$name' --parallel=$PARALLEL $STUDY_DATA \
      ${OVERRIDES[$name]:-} --bootstrap=$BOOTSTRAP --noprogress > '$WORK/${name}_report.txt'"
  cp -f "$WORK/$name/results.csv" "$WORK/$name.csv" 2>/dev/null
  publish
}

# grid NAME EXPERIMENT: `attnlab sweep` alone, stopped like a study; its results table comes back
# and is fitted here.
grid() {
  local name=$1 experiment=$2 seconds
  seconds=$(left)
  if [ "$seconds" -lt 30 ]; then say "$name: no time left this call; run me again"; return; fi
  local extra=()
  eval "extra=(${OVERRIDES[$name]:-})"  # the words override() quoted
  stage "$name" timeout --signal=TERM --kill-after=30 "$seconds" "${ATTNLAB[@]}" sweep \
      --config="$experiment" --sweep="$WORK/$name" --parallel=$PARALLEL --noprogress "${extra[@]}"
  cp -f "$WORK/$name/results.csv" "$WORK/$name.csv" 2>/dev/null
  publish
}
wanted() { case " $STAGES " in *" $1 "*) return 0 ;; esac; return 1; }

# icl NAME EXPERIMENT: a task sweep (`grid`), then `attnlab icl --sweep` scores its finished runs.
icl() {
  local name=$1
  grid "$@"
  [ -e "$WORK/.done-$name" ] || return 0
  stage "${name}_icl" "${ATTNLAB[@]}" icl --sweep="$WORK/$name"
  cp -f "$WORK/$name/icl.json" "$WORK/${name}_icl.json" 2>/dev/null
  publish
}

# timed NAME SECONDS COMMAND...: a stage that needs about SECONDS (measured on an H200), run
# only when that much of the budget is left.
timed() {
  local name=$1 needs=$2; shift 2
  if [ -e "$WORK/.done-$name" ] || [ "$(left)" -ge "$needs" ]; then stage "$name" "$@"
  else say "$name: needs ~$needs s, $(left) s left; run me again"; fi
}

STUDY_DATA=
if [ -f "$CORPUS" ]; then  # unpacked once; a study's corpus is then cached by its fingerprint
  [ -d "$WORK/corpus/pystdlib" ] || { mkdir -p "$WORK/corpus.partial" \
      && tar -xJf "$CORPUS" -C "$WORK/corpus.partial" && mv "$WORK/corpus.partial" "$WORK/corpus"; }
  STUDY_DATA="--config.base.data.source=text_files --config.base.data.path=$WORK/corpus/pystdlib"
fi
if [ -f "$RESUME" ]; then  # the last lease's finished runs: the sweeps train only the rest
  "$PY" benchmarks/device_runs.py unpack "$RESUME" "$WORK" | tee -a "$LOG"
fi
say "device session: smoke=$SMOKE budget=${BUDGET}s stages='$STAGES' corpus='${STUDY_DATA:-the machine pystdlib}' work=$WORK out=$OUTDIR"
stage env bash -c "${ATTNLAB[*]} env --json='$WORK/env.json'"
if [ "$SMOKE" = 1 ]; then
  PARALLEL=1 BOOTSTRAP=8
  wanted quickstart_tuned && study quickstart_tuned experiments/tiny_isoflop.py:cpu_tuned
  wanted quickstart && study quickstart experiments/tiny_isoflop.py
  wanted gpu && stage gpu bash -c "$PY benchmarks/gpu.py --smoke --ks 1,2 > '$WORK/gpu.md'"
  wanted regression && icl regression experiments/regression_seeds.py:smoke
  wanted hparams && grid hparams experiments/tiny_grid.py
  wanted architectures && study architectures experiments/tiny_isoflop.py
  wanted checks && stage checks "$PY" benchmarks/device_checks.py --smoke --out "$WORK/checks.md"
else
  PARALLEL=4 BOOTSTRAP=200
  wanted quickstart_tuned && study quickstart_tuned experiments/quickstart.py:gpu_tuned
  wanted quickstart && study quickstart experiments/quickstart.py:gpu
  wanted regression && icl regression experiments/regression_seeds.py:gpu
  wanted gpu && timed gpu 150 bash -c "$PY benchmarks/gpu.py --batch 32 --ks 1,16 > '$WORK/gpu.md'"
  wanted hparams && grid hparams experiments/hparams.py:gpu_refined
  wanted architectures && study architectures experiments/architectures.py:gpu
  wanted checks && timed checks 240 "$PY" benchmarks/device_checks.py --out "$WORK/checks.md"
fi
publish
missing=$(for s in env $STAGES; do [ -e "$WORK/.done-$s" ] || echo -n "$s "; done)
wanted regression && { [ -e "$WORK/.done-regression_icl" ] || missing+="regression_icl "; }
say "stages not done: ${missing:-none}; results in $OUTDIR"
publish
[ -z "$missing" ]
