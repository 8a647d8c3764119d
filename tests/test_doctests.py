"""The examples in public docstrings run as written."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["tfdist", "tfdist.errors", "tfdist.cluster", "tfdist.strategy", "tfdist.probe", "tfdist.testing",
           "tfdist.launch.config", "tfdist.launch.emit", "tfdist.launch.runner", "tfdist.launch.results",
           "tfdist.launch._process", "tfdist.launch.environment",
           "tfdist.launch.engine", "tfdist.launch.engines", "tfdist.launch._reaper", "tfdist.launch.elastic",
           "tfdist.membership", "tfdist.keras.elastic",
           "tfdist.data.sharding", "tfdist.data.sampling", "tfdist.data.report", "tfdist.keras.adaptive",
           "tfdist.data.remote", "tfdist.data.writer", "tfdist.data.options", "tfdist.data.files",
           "tfdist.data.verify", "tfdist.data.reading", "tfdist.data.stratify", "tfdist.data.parsing",
           "tfdist.data.pipeline", "tfdist.keras", "tfdist.clean_exit", "tfdist.plan",
           "tfdist.collective", "tfdist.autotune", "tfdist.keras.communication", "tfdist.keras.accumulation",
           "tfdist.keras.embeddings", "tfdist.exit_codes", "tfdist._slurm", "tfdist._jobset",
           "tfdist.launch._emit_k8s", "tfdist.launch._emit_slurm", "tfdist.launch.server", "tfdist._compat",
           "tfdist.stack", "tfdist.data.s3", "tfdist.data.staging",
           "tfdist.resolver", "tfdist.launch._tf_logs", "tfdist.cli._common"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
