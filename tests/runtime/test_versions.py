"""Version facts from package metadata (no TensorFlow import): parsing, the supported range, tensorflow-io."""

from __future__ import annotations

import sys

import pytest

from tfdist.runtime import versions


def test_parse_version_takes_major_and_minor() -> None:
    assert versions.parse_version("2.17.1") == (2, 17)
    assert versions.parse_version("2.21.0rc2") == (2, 21)
    assert versions.parse_version("3.0") == (3, 0)


def test_the_installed_stack_is_supported_and_named() -> None:
    assert versions.stack_problem() is None, versions.stack_problem()
    tf, keras = versions.installed_version("tensorflow"), versions.installed_version("tf-keras")
    assert tf is not None and keras is not None
    assert versions.SUPPORTED_TF[0] <= versions.parse_version(tf) <= versions.SUPPORTED_TF[1]
    assert versions.stack_text() == f"TensorFlow {tf} with tf-keras {keras}"
    assert versions.installed_version("no-such-distribution-tfdist") is None


def test_tensorflow_io_availability_matches_the_stack() -> None:
    tf_minor = versions.parse_version(versions.installed_version("tensorflow") or "0.0")
    reason = versions.tfio_unavailable_reason()
    if tf_minor > versions.TFIO_LAST_TF:
        assert reason is not None and ("not installed" in reason or "cannot load" in reason)
    elif versions.installed_version("tensorflow-io") is not None:
        assert reason is None


def test_keras3_is_seen_only_once_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = type(sys)("keras")
    monkeypatch.setitem(sys.modules, "keras", fake)
    assert versions.keras3_loaded() is None  # No __version__: not Keras 3.
    fake.__version__ = "2.17.0"  # type: ignore[attr-defined]
    assert versions.keras3_loaded() is None
    fake.__version__ = "3.6.0"  # type: ignore[attr-defined]
    assert versions.keras3_loaded() == "3.6.0"
