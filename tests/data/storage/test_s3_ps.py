"""s3:// through boto3 on ParameterServerStrategy workers: a real cluster fits from a moto server on 127.0.0.1.

The workers' staging agents download the objects; the pipelines wait for them with TF ops
(tfdist/data/storage/staging.py). TFDIST_S3_READER=boto3, so the pinned stack (where tensorflow-io works) takes the
same path as TF 2.21. The tf.data service and the agents' protocol: tests/data/storage/test_staging.py.
"""

from __future__ import annotations

import os

import pytest

from tests.data.storage import _tasks_s3_ps as s3_ps_task  # the chief's function, run by the cluster's chief task.
from tfdist import testing

pytestmark = [pytest.mark.s3]


@pytest.mark.multiprocess
@pytest.mark.timeout(400)
def test_ps_fit_reads_every_s3_record_through_the_workers_staging_agents(
    s3_server: dict[str, str], tmp_path: str
) -> None:
    stage = os.path.join(str(tmp_path), "stage")
    env = dict(s3_server, TFDIST_S3_READER="boto3", TFDIST_S3_STAGE_DIR=stage, TFDIST_S3_STAGE_TIMEOUT="120")
    run = testing.run_cluster(
        s3_ps_task.fit_from_s3, workers=2, ps=1, chief=True, timeout=360, args=["tfdist-ps"], env=env
    )
    tails = "".join(f"\n--- {task}:\n" + run.output(task)[-2000:] for task in ("worker:0", "worker:1", "chief:0"))
    assert run.ok, run.result.summary() + tails  # Where each task stood when it failed or timed out.
    result = run.values["chief:0"]
    # Every record read, each worker's stream in the same order: 1200 records over 600 ids, so every id at
    # least once, and no id more than (workers) times more often than another.
    train = result["train"][: s3_ps_task.NUM_IDS]
    assert sum(result["train"]) == 60 * s3_ps_task.BATCH
    assert min(train) >= 1 and max(train) - min(train) <= 2, train
    # The damaged object: its 5 whole records read, the cut one and the rest never (on_corrupt='skip').
    skip = result["skip"]
    assert sum(skip) == 10 * s3_ps_task.BATCH
    assert all(skip[i] >= 1 for i in [*range(1000, 1010), *range(1015, 1020)]), skip[1000:1020]
    assert all(skip[i] == 0 for i in range(1010, 1015)), skip[1000:1020]
    assert "bad/part-b" in result["raise"], result["raise"]
    assert result["unchecked"].startswith("DataLossError"), result["unchecked"]
    # The workers' agents staged the 15 objects, once each (two agents share one host's stage root); the chief
    # (the coordinator) ran no agent.
    staged = sorted(os.listdir(os.path.join(stage, "objects")))
    assert len([name for name in staged if name.endswith(".staged")]) == 15, staged
    # The agent speaks at its first request; the two agents share the host's requests, so one may serve them all.
    said = [
        task
        for task in ("worker:0", "worker:1")
        if "Staging agent serving s3:// requests in " + stage in run.output(task)
    ]
    assert said, run.output("worker:0")[-2000:]
    assert "Staging agent serving" not in run.output("chief:0")
    assert "Staging agent serving" not in run.output("ps:0")
