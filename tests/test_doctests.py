"""The examples in public docstrings run as written."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "tfdist",
    "tfdist.errors",
    "tfdist._options",
    "tfdist.cluster.spec",
    "tfdist.strategy.builders",
    "tfdist.cluster.probe",
    "tfdist.testing",
    "tfdist.launch.config",
    "tfdist.launch.events",
    "tfdist.launch.emit.formats",
    "tfdist.launch.supervisor.runner",
    "tfdist.launch.results",
    "tfdist.launch.engines._process",
    "tfdist.launch.environment",
    "tfdist.launch.engines.base",
    "tfdist.launch.engines.local",
    "tfdist.launch.engines._ports",
    "tfdist.launch.engines.registry",
    "tfdist.launch.engines._reaper",
    "tfdist.launch.supervisor.membership",
    "tfdist.launch.supervisor._group",
    "tfdist.launch.supervisor._faults",
    "tfdist.launch.supervisor._elastic",
    "tfdist.cluster.elastic",
    "tfdist.keras.elastic",
    "tfdist.data.sharding",
    "tfdist.data.sampling",
    "tfdist.data.report",
    "tfdist.keras.adaptive",
    "tfdist.data.storage.remote",
    "tfdist.data.records.writer",
    "tfdist.data.pipeline.options",
    "tfdist.data.records.files",
    "tfdist.data.records.verify",
    "tfdist.data.pipeline.reading",
    "tfdist.data.pipeline.stratified",
    "tfdist.data.pipeline.parsing",
    "tfdist.data.pipeline.tfrecord",
    "tfdist.keras",
    "tfdist.runtime.clean_exit",
    "tfdist.plan",
    "tfdist.comm.collective",
    "tfdist.comm.autotune",
    "tfdist.keras.communication",
    "tfdist.keras.accumulation",
    "tfdist.keras.embeddings",
    "tfdist.runtime.exit_codes",
    "tfdist.cluster.slurm",
    "tfdist.cluster.jobset",
    "tfdist.launch.emit.kubernetes",
    "tfdist.launch.emit.slurm",
    "tfdist.launch.server",
    "tfdist._compat",
    "tfdist.stack",
    "tfdist.data.storage.s3",
    "tfdist.data.storage.staging",
    "tfdist.strategy.resolver",
    "tfdist.launch.output",
    "tfdist.runtime.program",
    "tfdist.runtime.logs",
    "tfdist.runtime.versions",
    "tfdist.cluster",
    "tfdist.cluster.address",
    "tfdist.data",
    "tfdist.launch",
    "tfdist.runtime",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
