"""``tfdist doctor --stack``'s report: the Keras 3 path, and a stack without tf-keras (as TensorFlow 2.22's).

tf-keras is hidden from the package metadata here (``versions.installed_version``), which is where the report,
``stack_problem`` and ``check_internals`` look; tests/keras/test_keras3_resume.py trains without it.
"""

from __future__ import annotations

import pytest

from tfdist.runtime import versions
from tfdist.stack import keras3_range, stack_report


@pytest.fixture
def without_tf_keras(monkeypatch: pytest.MonkeyPatch) -> None:
    installed = versions.installed_version
    monkeypatch.setattr(versions, "installed_version", lambda name: None if name == "tf-keras" else installed(name))
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)


def test_the_keras3_range_says_where_a_version_stands() -> None:
    assert keras3_range(None) == keras3_range("2.17.0") == ""
    assert keras3_range("3.10.0") == keras3_range("3.15.1") == "in the range measured right (3.10 to 3.15)"
    assert keras3_range("3.9.2").startswith("older than the range measured right (3.10 to 3.15): refused under")
    assert keras3_range("3.16.0.dev2026102704").startswith("newer than the range measured right (3.10 to 3.15)")


@pytest.mark.usefixtures("without_tf_keras")
def test_without_tf_keras_a_right_keras3_is_a_supported_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    keras = versions.keras_version()
    assert keras is not None and versions.parse_version(keras) >= versions.KERAS3_MEASURED[0]
    assert versions.stack_problem() is None
    report = stack_report()
    assert report.ok and report.tf_keras is None, report.problems
    text = report.to_text()
    assert "tf-keras:           not installed" in text and text.endswith("stack: supported")
    assert f"keras (Keras 3):    {keras} - {keras3_range(keras)}" in text
    (warning,) = [w for w in report.warnings if w.startswith("tf-keras is not installed: Keras 3 models")]
    assert f"pip install '{versions.tf_keras_pin()}'" in warning
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")  # tf.keras would fail to import: said, with the fix.
    assert any(w.startswith("TF_USE_LEGACY_KERAS is 1, but tf-keras is not installed") for w in stack_report().warnings)
    monkeypatch.setattr(versions, "keras_version", lambda: "3.9.2")  # No Keras tfdist trains: a problem.
    problem = versions.stack_problem()
    assert problem is not None and problem.startswith("Neither tf-keras nor a Keras 3 from 3.10 is installed")
    assert f"'{versions.tf_keras_pin()}'" in problem and "'keras>=3.10'" in problem


@pytest.mark.usefixtures("without_tf_keras")
def test_without_tf_keras_the_probe_checks_the_keras3_path_and_skips_the_tf_keras_internals() -> None:
    from tfdist._compat.checks import _CHECKS, _TF_KERAS_CHECKS, SKIPPED, check_internals

    checked = check_internals()
    assert {name for name, value in checked.items() if value == SKIPPED} == set(_TF_KERAS_CHECKS)
    assert set(checked) == set(_CHECKS) and {checked[name] for name in set(_CHECKS) - set(_TF_KERAS_CHECKS)} == {"ok"}
    report = stack_report(probe=True)
    assert report.ok, report.problems
    resolved = len(_CHECKS) - len(_TF_KERAS_CHECKS)
    assert report.internals == (
        f"ok: {resolved} private TF/Keras 3 internals resolve ({len(_TF_KERAS_CHECKS)} of tf-keras: {SKIPPED})"
    )
    assert report.keras3_fit == f"keras {versions.keras_version()}: fit fixed for MultiWorkerMirroredStrategy"
