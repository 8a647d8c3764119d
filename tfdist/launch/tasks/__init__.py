"""The programs a launch starts in each task (``python -m tfdist.launch.tasks.NAME``).

``server`` (a TensorFlow server for ps and idle workers), ``slurm`` and ``jobset`` (per-task entries that
read the manager's environment), ``function`` (a Python function as a task), ``netns`` (the holder of the
local engine's private network namespace), ``data_service`` (a local tf.data service), ``tf_config`` (a
TFJob pod's entry under a mesh). They live in the launch layer, not in :mod:`tfdist.cli`, because the
launcher starts them: the layer rule also reads module names in strings. Their table, from which every
command line that starts one is built, is :class:`tfdist.launch.tasks.programs.TaskProgram`.
"""
