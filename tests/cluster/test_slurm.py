"""Slurm: hostlists, task counts, layout equal to TensorFlow's SlurmClusterResolver."""

from __future__ import annotations

import pytest

from tfdist import ClusterSpec, ClusterSpecError

STEP = {
    "SLURM_PROCID": "0",
    "SLURM_STEP_NODELIST": "node[01-02],gpu7",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2),1",
    "SLURM_STEP_NUM_TASKS": "5",
}


@pytest.mark.parametrize(
    "procid,task,address",
    [
        pytest.param("0", ("chief", 0), "gpu7:8888", id="rank0_chief"),
        pytest.param("1", ("ps", 0), "node01:8888", id="rank1_ps"),
        pytest.param("2", ("worker", 0), "node01:8889", id="rank2_worker0"),
        pytest.param("4", ("worker", 2), "node02:8889", id="rank4_worker2"),
    ],
)
def test_layout_follows_procid(procid: str, task: tuple, address: str) -> None:
    env = dict(STEP, SLURM_PROCID=procid)
    spec = ClusterSpec.from_slurm(env, jobs={"chief": 1, "ps": 1, "worker": 3})
    assert (spec.task_type, spec.task_id) == task
    assert spec.task.address == address  # type: ignore[union-attr]


def test_batch_script_variables_and_default_jobs() -> None:
    env = {"SLURM_PROCID": "1", "SLURM_JOB_NODELIST": "cn[9-10]", "SLURM_TASKS_PER_NODE": "1(x2)"}
    spec = ClusterSpec.from_slurm(env, port_base=7000)
    assert dict(spec.jobs["worker"]) == {0: "cn10:7000", 1: "cn9:7000"}
    assert (spec.task_type, spec.task_id) == ("worker", 1)


def test_zero_padding_and_suffix() -> None:
    env = {"SLURM_PROCID": "0", "SLURM_NODELIST": "r[008-010]-ib", "SLURM_TASKS_PER_NODE": "1(x3)"}
    assert [t.address for t in ClusterSpec.from_slurm(env).tasks()] == ["r008-ib:8888", "r009-ib:8888", "r010-ib:8888"]


@pytest.mark.parametrize(
    "env,message",
    [
        pytest.param({}, "SLURM_PROCID.*Run inside 'srun'", id="no_procid"),
        pytest.param(dict(STEP, SLURM_PROCID="²"), "`SLURM_PROCID`. Received: '²'", id="unicode_procid"),
        pytest.param(dict(STEP, SLURM_STEP_NODELIST="n[1-²]"), "low <= high", id="unicode_range"),
        pytest.param(dict(STEP, SLURM_STEP_NODELIST="node[1-"), "Slurm hostlist", id="bad_hostlist"),
        pytest.param(dict(STEP, SLURM_STEP_NODELIST="node[5-1]"), "low <= high", id="reversed_range"),
        pytest.param(dict(STEP, SLURM_STEP_TASKS_PER_NODE="2(y2)"), "task count list", id="bad_counts"),
        pytest.param(dict(STEP, SLURM_STEP_TASKS_PER_NODE="2"), "one count per host", id="count_mismatch"),
        pytest.param(dict(STEP, SLURM_PROCID="9"), "rank below the 5 tasks", id="rank_too_big"),
    ],
)
def test_bad_environment(env: dict, message: str) -> None:
    with pytest.raises(ClusterSpecError, match=message):
        ClusterSpec.from_slurm(env, jobs={"chief": 1, "ps": 1, "worker": 3})


def test_jobs_must_add_up() -> None:
    with pytest.raises(ClusterSpecError, match="add up to the 5 Slurm tasks"):
        ClusterSpec.from_slurm(STEP, jobs={"worker": 4})


def test_same_layout_as_tensorflow_resolver() -> None:
    tf = pytest.importorskip("tensorflow")
    jobs = {"chief": 1, "ps": 1, "worker": 3}
    for procid in range(5):
        env = dict(STEP, SLURM_PROCID=str(procid))
        with pytest.MonkeyPatch.context() as patch:
            for key, value in env.items():
                patch.setenv(key, value)
            # TF's resolver needs a GPU per task to lay tasks out; give it one and keep the env untouched.
            resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
                jobs=jobs, gpus_per_node=2, gpus_per_task=1, auto_set_gpu=False
            )
            theirs = resolver.cluster_spec().as_dict()
            their_task = resolver.get_task_info()
        ours = ClusterSpec.from_slurm(env, jobs=jobs)
        assert ours.cluster_dict() == theirs
        assert (ours.task_type, ours.task_id) == their_task


def test_tensorflow_resolver_fails_on_cpu_nodes() -> None:
    """Why tfdist lays Slurm tasks out itself: TF's resolver cannot describe GPU-less nodes."""
    tf = pytest.importorskip("tensorflow")
    with pytest.MonkeyPatch.context() as patch:
        for key, value in STEP.items():
            patch.setenv(key, value)
        with pytest.raises(RuntimeError, match="Requested more GPUs per node than available"):
            tf.distribute.cluster_resolver.SlurmClusterResolver(
                jobs={"worker": 5}, gpus_per_node=0, gpus_per_task=1, auto_set_gpu=False
            )
        with pytest.raises(ValueError, match="range\\(\\) arg 3 must not be zero"):
            tf.distribute.cluster_resolver.SlurmClusterResolver(
                jobs={"worker": 5}, gpus_per_node=0, gpus_per_task=0, auto_set_gpu=False
            ).cluster_spec()
        from tfdist.strategy.resolver import slurm_cluster_resolver

        ours = slurm_cluster_resolver(jobs={"worker": 5})
        assert len(ours.cluster_spec().as_dict()["worker"]) == 5
        assert ours.task_type == "worker"
