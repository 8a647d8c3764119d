#!/usr/bin/env bash
# The tfdist demo. Creates .venv if missing and installs tfdist, writes a synthetic long-tail JPEG dataset
# (8 classes, 8k 64x64 images, per-class shards), prints its skew report, then trains a small CNN on a local
# cluster twice - stratified and natural sampling - and prints what skew handling buys.
#
#   scripts/run_demo.sh                       # chief + 2 workers + 1 ps (ParameterServerStrategy)
#   scripts/run_demo.sh --strategy mwms       # 2 workers, MultiWorkerMirroredStrategy
#   scripts/run_demo.sh --data DIR --label-key label --image-size 64 --classes 10 --epochs 5
#       (your own data: DIR/train-* written with write_tfrecords(partition_by=LABEL) and DIR/val-*)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
tfdist_venv
cd "$ROOT"

strategy=ps data="" label=label image_size=48 classes=8 epochs=3 out=demo-out
while [ $# -gt 0 ]; do
  case "$1" in
    --strategy) strategy="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --label-key) label="$2"; shift 2 ;;
    --image-size) image_size="$2"; shift 2 ;;
    --classes) classes="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "run_demo.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$strategy" in
  ps) topology=(--chief --workers 2 --ps 1); workers=2 ;;
  mwms) topology=(--workers 2); workers=2 ;;
  *) echo "run_demo.sh: --strategy must be ps or mwms, not '$strategy'" >&2; exit 2 ;;
esac

# `tfdist quiet --` leaves TensorFlow's start-up noise out of a single process's stderr, as tfdist-launch does
# for its tasks (docs/launch.md); real warnings and errors pass. TF_CPP_MIN_LOG_LEVEL=0 shows everything.
if [ -z "$data" ]; then
  data="$out/data"
  if [ ! -f "$data/train-manifest.json" ]; then
    echo "== writing a synthetic long-tail dataset to $data"
    tfdist quiet -- python scripts/make_synthetic_images.py --out "$data/train" --num 8000 --classes 8 \
      --size 64 --skew long-tail --shards 2 --partition
    tfdist quiet -- python scripts/make_synthetic_images.py --out "$data/val" --num 800 --classes 8 --size 64 \
      --skew uniform --shards 2 --seed 1
  fi
fi

echo; echo "== skew report: $data/train-* over $workers workers"
tfdist quiet -- tfdist data-report "$data/train-*" --label-key "$label" --workers "$workers"

for sampling in stratified natural; do
  echo; echo "== training ($strategy, $sampling sampling): tfdist-launch ${topology[*]} -- python scripts/demo.py"
  rm -rf "$out/$sampling"
  tfdist-launch "${topology[@]}" --timeout 900 --log-dir "$out/$sampling/logs" -- \
    python scripts/demo.py --data "$data" --out "$out/$sampling" --sampling "$sampling" --label-key "$label" \
    --image-size "$image_size" --classes "$classes" --epochs "$epochs"
done

python - "$out" <<'PY'
import json, sys
runs = {s: json.load(open(f"{sys.argv[1]}/{s}/summary.json")) for s in ("stratified", "natural")}
a, b = runs["stratified"], runs["natural"]
print("\n== tfdist demo summary")
print(f"strategy {a['strategy']}, {a['epochs']} epochs x {a['steps_per_epoch']} steps; sharding {a['sharding']}")
print(f"records per worker: {a['worker_records']}")
print(f"{'':18}{'stratified':>12}{'natural':>12}")
print(f"{'examples/s':18}{a['examples_per_s']:>12}{b['examples_per_s']:>12}")
print(f"{'val accuracy':18}{a['val_accuracy']:>12.3f}{b['val_accuracy']:>12.3f}")
for c in a["per_class_accuracy"]:
    print(f"{'class ' + c + ' accuracy':18}{a['per_class_accuracy'][c]:>12.3f}{b['per_class_accuracy'].get(c, 0):>12.3f}")
worst = lambda r: min(r["per_class_accuracy"].values())
print(f"worst class: stratified {worst(a):.3f} vs natural {worst(b):.3f}; TensorBoard logs under {sys.argv[1]}/*/tensorboard")
PY
