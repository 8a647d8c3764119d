#!/usr/bin/env bash
# Creates .venv if missing, installs tfdist, then runs a real 2-worker MultiWorkerMirroredStrategy
# model.fit on synthetic data on localhost and prints both workers' results.
# Extra arguments go to scripts/demo_train.py (e.g. --epochs 5).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
tfdist_venv
cd "$ROOT"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
tfdist-launch --workers 2 --timeout 600 -- python scripts/demo_train.py "$@" | tee "$out"
python - "$out" <<'PY'
import json, re, sys
results = [json.loads(m) for m in re.findall(r"^\[\S+\] RESULT (.*)$", open(sys.argv[1]).read(), re.M)]
print("\n== tfdist demo: 2-worker MultiWorkerMirroredStrategy fit ==")
for r in results:
    print(f"{r['task']:<9} replicas={r['replicas']} loss={r['loss']:.4f} accuracy={r['accuracy']:.3f} "
          f"examples/s={r['examples_per_s']} weights={r['weights_sha1']} cluster={r['fingerprint']}")
same = len({r["weights_sha1"] for r in results}) == 1 and len(results) == 2
print("both workers hold identical weights" if same else "WEIGHTS DIFFER between workers")
sys.exit(0 if same else 1)
PY
