#!/usr/bin/env bash
# The tfdist demo. Creates .venv if missing and installs tfdist with its demo extra (scikit-learn,
# matplotlib), writes scikit-learn's handwritten digits as a long-tailed train set (10 classes, 140 images of
# digit 0 down to 10 of digit 9) and a balanced validation set, prints the skew report, then trains a small
# CNN on a local cluster with natural sampling and with two stratified mixes (class_weights 'sqrt' and
# 'balanced'), each over several seeds, and prints per-class accuracy (mean ± std over the seeds) beside what
# ran, with a picture (OUT/demo.png).
#
#   scripts/run_demo.sh                       # chief + 2 workers + 1 ps (ParameterServerStrategy), 3 seeds
#   scripts/run_demo.sh --strategy mwms       # 2 workers, MultiWorkerMirroredStrategy
#   scripts/run_demo.sh --seeds 5 --epochs 30 --runs "natural balanced"
#   scripts/run_demo.sh --data DIR --label-key label --image-size 64 --classes 10
#       (your own data: DIR/train-* written with write_tfrecords(partition_by=LABEL) and DIR/val-*)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
tfdist_venv demo
cd "$ROOT"

strategy=ps data="" label=label image_size=8 classes=10 epochs=8 seeds=3 runs="natural sqrt balanced" out=demo-out
while [ $# -gt 0 ]; do
  case "$1" in
    --strategy) strategy="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --label-key) label="$2"; shift 2 ;;
    --image-size) image_size="$2"; shift 2 ;;
    --classes) classes="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --seeds) seeds="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "run_demo.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$strategy" in
  # Under ParameterServerStrategy the workers claim the steps of one pipeline over all the files.
  ps) topology=(--chief --workers 2 --ps 1); pipelines=1 ;;
  mwms) topology=(--workers 2); pipelines=2 ;;
  *) echo "run_demo.sh: --strategy must be ps or mwms, not '$strategy'" >&2; exit 2 ;;
esac
for run in $runs; do
  case "$run" in
    natural|sqrt|balanced) ;;
    *) echo "run_demo.sh: --runs takes natural, sqrt and balanced, not '$run'" >&2; exit 2 ;;
  esac
done

# `tfdist quiet --` leaves TensorFlow's start-up noise out of a single process's stderr, as tfdist-launch does
# for its tasks (docs/launch.md); real warnings and errors pass. TF_CPP_MIN_LOG_LEVEL=0 shows everything.
if [ -z "$data" ]; then
  data="$out/digits"
  if [ ! -f "$data/train-manifest.json" ] || [ ! -f "$data/val-manifest.json" ]; then
    echo "== writing scikit-learn's digits to $data (long-tailed train set, balanced validation set)"
    tfdist quiet -- python scripts/make_digits.py --out "$data"
  fi
fi

echo; echo "== skew report: $data/train-* over the $pipelines input pipeline(s) that $strategy builds"
tfdist quiet -- tfdist data-report "$data/train-*" --label-key "$label" --workers "$pipelines"

for run in $runs; do
  if [ "$run" = natural ]; then sampling=(--sampling natural); else sampling=(--sampling stratified --class-weights "$run"); fi
  echo; echo "== training ($strategy, ${sampling[*]}, $seeds seeds): tfdist-launch ${topology[*]} -- python scripts/demo.py"
  rm -rf "${out:?}/$run"
  tfdist-launch "${topology[@]}" --timeout 900 --log-dir "$out/$run/logs" -- \
    python scripts/demo.py --data "$data" --out "$out/$run" "${sampling[@]}" --label-key "$label" \
    --image-size "$image_size" --classes "$classes" --epochs "$epochs" --seeds "$seeds"
done

echo
# shellcheck disable=SC2086  # One run directory per word.
python scripts/demo_report.py "$out" $runs
echo "TensorBoard logs under $out/*/seed-*/tensorboard; the demo took ${SECONDS}s"
