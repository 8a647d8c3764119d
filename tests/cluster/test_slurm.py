"""Slurm: hostlists, task counts, layout equal to TensorFlow's SlurmClusterResolver."""

from __future__ import annotations

import pytest
from absl.testing import parameterized

from tfdist import ClusterSpec, ClusterSpecError

STEP = {
    "SLURM_PROCID": "0",
    "SLURM_STEP_NODELIST": "node[01-02],gpu7",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2),1",
    "SLURM_STEP_NUM_TASKS": "5",
}


class SlurmTest(parameterized.TestCase):
    @parameterized.named_parameters(
        ("rank0_chief", "0", ("chief", 0), "gpu7:8888"),
        ("rank1_ps", "1", ("ps", 0), "node01:8888"),
        ("rank2_worker0", "2", ("worker", 0), "node01:8889"),
        ("rank4_worker2", "4", ("worker", 2), "node02:8889"),
    )
    def test_layout_follows_procid(self, procid: str, task: tuple, address: str) -> None:
        env = dict(STEP, SLURM_PROCID=procid)
        spec = ClusterSpec.from_slurm(env, jobs={"chief": 1, "ps": 1, "worker": 3})
        self.assertEqual((spec.task_type, spec.task_id), task)
        self.assertEqual(spec.task.address, address)  # type: ignore[union-attr]

    def test_batch_script_variables_and_default_jobs(self) -> None:
        env = {"SLURM_PROCID": "1", "SLURM_JOB_NODELIST": "cn[9-10]", "SLURM_TASKS_PER_NODE": "1(x2)"}
        spec = ClusterSpec.from_slurm(env, port_base=7000)
        self.assertEqual(dict(spec.jobs["worker"]), {0: "cn10:7000", 1: "cn9:7000"})
        self.assertEqual((spec.task_type, spec.task_id), ("worker", 1))

    def test_zero_padding_and_suffix(self) -> None:
        env = {"SLURM_PROCID": "0", "SLURM_NODELIST": "r[008-010]-ib", "SLURM_TASKS_PER_NODE": "1(x3)"}
        self.assertEqual(
            [t.address for t in ClusterSpec.from_slurm(env).tasks()], ["r008-ib:8888", "r009-ib:8888", "r010-ib:8888"]
        )

    @parameterized.named_parameters(
        ("no_procid", {}, "SLURM_PROCID.*Run inside 'srun'"),
        ("unicode_procid", dict(STEP, SLURM_PROCID="²"), "`SLURM_PROCID`. Received: '²'"),
        ("unicode_range", dict(STEP, SLURM_STEP_NODELIST="n[1-²]"), "low <= high"),
        ("bad_hostlist", dict(STEP, SLURM_STEP_NODELIST="node[1-"), "Slurm hostlist"),
        ("reversed_range", dict(STEP, SLURM_STEP_NODELIST="node[5-1]"), "low <= high"),
        ("bad_counts", dict(STEP, SLURM_STEP_TASKS_PER_NODE="2(y2)"), "task count list"),
        ("count_mismatch", dict(STEP, SLURM_STEP_TASKS_PER_NODE="2"), "one count per host"),
        ("rank_too_big", dict(STEP, SLURM_PROCID="9"), "rank below the 5 tasks"),
    )
    def test_bad_environment(self, env: dict, message: str) -> None:
        with pytest.raises(ClusterSpecError, match=message):
            ClusterSpec.from_slurm(env, jobs={"chief": 1, "ps": 1, "worker": 3})

    def test_jobs_must_add_up(self) -> None:
        with pytest.raises(ClusterSpecError, match="add up to the 5 Slurm tasks"):
            ClusterSpec.from_slurm(STEP, jobs={"worker": 4})

    def test_same_layout_as_tensorflow_resolver(self) -> None:
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
            self.assertEqual(ours.cluster_dict(), theirs)
            self.assertEqual((ours.task_type, ours.task_id), their_task)

    def test_tensorflow_resolver_fails_on_cpu_nodes(self) -> None:
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
            self.assertLen(ours.cluster_spec().as_dict()["worker"], 5)
            self.assertEqual(ours.task_type, "worker")
