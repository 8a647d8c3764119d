"""Emit a launch for another cluster manager: TF_CONFIG per task, Kubeflow TFJob, JobSet, a Slurm script.

Modules: ``formats`` (the dispatch and TF_CONFIG), ``kubernetes`` (TFJob and JobSet), ``slurm`` (sbatch).
"""

from tfdist.launch.emit.formats import (
    jobset_manifest,
    slurm_script,
    tf_configs,
    tfjob_manifest,
    to_yaml,
    validate_tfjob,
)

__all__ = ["jobset_manifest", "slurm_script", "tf_configs", "tfjob_manifest", "to_yaml", "validate_tfjob"]
