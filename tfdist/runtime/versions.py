"""Which TensorFlow, tf-keras and tensorflow-io are installed, and whether tfdist supports them.

Read from package metadata, without importing TensorFlow, so the CLIs and the launcher can tell a user
what to install before anything heavy loads. The private internals tfdist reaches into on those versions
are :mod:`tfdist._compat`'s; :mod:`tfdist.stack` builds the user-facing report from both.

Example:
    >>> from tfdist.runtime import versions
    >>> versions.parse_version("2.21.0rc1")
    (2, 21)
    >>> versions.SUPPORTED_TF
    ((2, 17), (2, 21))
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys

SUPPORTED_TF = ((2, 17), (2, 21))  # Inclusive minor range; 2.16 stalls MWMS start-up (BUILD_NOTES.md).
TFIO_LAST_TF = (2, 17)  # tensorflow-io 0.37.1's file systems have undefined symbols on TF >= 2.18.


def parse_version(text: str) -> tuple[int, int]:
    """(major, minor) of a version string such as '2.17.1' or '2.21.0rc1'."""
    major, minor = text.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def installed_version(distribution: str) -> str | None:
    """The installed version of a distribution ('tensorflow', 'tf-keras', ...), or None."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


KERAS_DISTRIBUTIONS = ("keras", "keras-nightly")  # TF 2.22.0rc0 depends on keras-nightly; both install `keras`.


def keras_version() -> str | None:
    """The installed version of the ``keras`` package, from whichever distribution installed it, or None.

    Example:
        >>> v = keras_version()
        >>> v is None or v[0].isdigit()
        True
    """
    for distribution in KERAS_DISTRIBUTIONS:
        version = installed_version(distribution)
        if version is not None:
            return version
    return None


def stack_text() -> str:
    """'TensorFlow X with tf-keras Y', as installed (None where one is missing)."""
    return f"TensorFlow {installed_version('tensorflow')} with tf-keras {installed_version('tf-keras')}"


def stack_problem() -> str | None:
    """Why the installed TF / tf-keras pair is unsupported, or None if it is supported."""
    tf_version, keras_version = installed_version("tensorflow"), installed_version("tf-keras")
    if tf_version is None:
        return "TensorFlow is not installed: pip install 'tensorflow>=2.17,<2.22'."
    tf_minor = parse_version(tf_version)
    if not SUPPORTED_TF[0] <= tf_minor <= SUPPORTED_TF[1]:
        return (
            f"TensorFlow {tf_version} is outside tfdist's range 2.17-2.21 (2.16 stalls at the start of a "
            "multi-worker fit). Install e.g. tensorflow==2.21.0 tf-keras==2.21.0."
        )
    if keras_version is None:
        return f"tf-keras is not installed: pip install '{tf_keras_pin()}'."
    if parse_version(keras_version) != tf_minor:
        return (
            f"tf-keras {keras_version} does not match TensorFlow {tf_version}: tf-keras must have TensorFlow's "
            f"minor version. pip install '{tf_keras_pin()}'."
        )
    return None


def tf_keras_pin() -> str:
    """The requirement of the tf-keras that goes with the installed TensorFlow: its minor version.

    Example:
        >>> pin = tf_keras_pin()
        >>> pin == "tf-keras" or pin.startswith("tf-keras==2.") and pin.endswith(".*")
        True
    """
    tf_version = installed_version("tensorflow")
    if tf_version is None:
        return "tf-keras"
    major, minor = parse_version(tf_version)
    return f"tf-keras=={major}.{minor}.*"


def install_hint(extra: str) -> str:
    """How to install one of tfdist's extras. tfdist is not on a package index: it installs from a clone
    (or from a wheel built in one), so the hint names the clone, never a package index.

    Example:
        >>> install_hint("s3")
        'pip install ".[s3]" in a tfdist clone (or the wheel built from one, with [s3])'
    """
    return f'pip install ".[{extra}]" in a tfdist clone (or the wheel built from one, with [{extra}])'


def tfio_unavailable_reason() -> str | None:
    """Why tensorflow-io's file systems cannot load here, or None when they can (no TF import)."""
    tf_version = installed_version("tensorflow")
    if importlib.util.find_spec("tensorflow_io") is None:
        return f"tensorflow-io is not installed (it loads on TF 2.17 only: {install_hint('tfio')})"
    if tf_version is not None and parse_version(tf_version) > TFIO_LAST_TF:
        return f"tensorflow-io's file systems cannot load on TF {tf_version} (undefined symbols on TF >= 2.18)"
    return None


def keras3_loaded() -> str | None:
    """The version of Keras 3 if a script has imported it (``import keras``), else None."""
    module = sys.modules.get("keras")
    version = str(getattr(module, "__version__", "")) if module is not None else ""
    return version if version[:1].isdigit() and int(version.split(".")[0]) >= 3 else None
