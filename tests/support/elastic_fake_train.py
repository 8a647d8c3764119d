"""A TensorFlow-free stand-in for an elastic Keras fit, for launcher tests (fast on a busy machine).

Every task prints its identity, then runs EPOCHS epochs of STEPS steps; the leader (TF_CONFIG worker 0) keeps
the last finished epoch in BACKUP (like BackupAndRestore) and records the epoch boundary for the launcher.
A restarted group resumes after the last backed-up epoch. Usage: _elastic_fake_train.py BACKUP EPOCHS
FAKE_BOUNDARIES_FROM=G: the leader records boundaries only from generation G (before it, like a script with
BackupAndRestore alone, or one whose fit has not begun).
"""

import json
import os
import sys
import time

from tfdist.cluster import elastic

backup, epochs = sys.argv[1], int(sys.argv[2])
tf_config = json.loads(os.environ["TF_CONFIG"])
index = tf_config["task"]["index"]
generation = int(os.environ["TFDIST_MEMBERSHIP"])
size = int(os.environ["TFDIST_WORLD_SIZE"])
print(
    f"task {os.environ['TFDIST_TASK']} index {index} generation {generation} world {size} "
    f"workers {len(tf_config['cluster']['worker'])}",
    flush=True,
)
# FAKE_CRASH=MARKER|TASK: TASK crashes in epoch 1 of generation 0, and its peers fail of the "collective error"
# 20 ms later, as MWMS peers do.
crash = os.environ["FAKE_CRASH"].split("|") if os.environ.get("FAKE_CRASH") and generation == 0 else None


def pause(seconds: float) -> None:
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        if crash and os.path.exists(crash[0]):
            time.sleep(0.02)  # the collective error reaches the peer, which raises and exits
            os._exit(1)
        time.sleep(0.001 if crash else seconds)


start = 0
if os.path.exists(backup):
    with open(backup) as f:
        start = int(f.read()) + 1
for epoch in range(start, epochs):
    if os.environ.get("FAKE_FAIL") == os.environ["TFDIST_TASK"] and generation == 0 and epoch == 1:
        sys.exit(3)  # a worker that keeps failing: its restarts get used up
    once = os.environ.get("FAKE_FAIL_ONCE")  # MARKER|TASK|GENERATION|EPOCH - fail there once, then work
    if once:
        marker, task, fail_generation, fail_epoch = once.split("|")
        if (task, int(fail_generation), int(fail_epoch)) == (
            os.environ["TFDIST_TASK"],
            generation,
            epoch,
        ) and not os.path.exists(marker):
            open(marker, "w").close()
            sys.exit(3)
    if crash and epoch == 1 and os.environ["TFDIST_TASK"] == crash[1]:
        open(crash[0], "w").close()
        os._exit(3)
    for step in range(3):
        pause(0.1)
        print(f"generation {generation} epoch {epoch} step {step}", flush=True)
    if index == 0:
        with open(backup + ".tmp", "w") as f:
            f.write(str(epoch))
        os.replace(backup + ".tmp", backup)
        if generation >= int(os.environ.get("FAKE_BOUNDARIES_FROM", "0")):
            elastic.write_boundary(
                os.environ["TFDIST_ELASTIC_DIR"], generation=generation, epoch=epoch, world_size=size
            )
        print(f"epoch {epoch} end", flush=True)
    else:
        pause(0.1)  # the leader's backup lands before any peer finishes the epoch
print(f"task {os.environ['TFDIST_TASK']} done", flush=True)
