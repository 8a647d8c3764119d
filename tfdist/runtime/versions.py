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
import subprocess
import sys
from collections.abc import Mapping

SUPPORTED_TF = ((2, 17), (2, 21))  # Inclusive minor range; 2.16 stalls MWMS start-up (BUILD_NOTES.md).
TFIO_LAST_TF = (2, 17)  # tensorflow-io 0.37.1's file systems have undefined symbols on TF >= 2.18.
# Keras 3 measured right on several replicas once tfdist fixed its trainer (3.4 to 3.15 tried): the first and
# the last minor. Older ones train or log wrong; newer ones are fixed where the names the fixes replace resolve.
KERAS3_MEASURED = ((3, 10), (3, 15))
# Exits 0 where the tf-keras distribution is installed, 3 where not: what another interpreter is asked.
_ASK_TF_KERAS = (
    "import importlib.metadata as m, sys\n"
    "try:\n    m.version('tf-keras')\nexcept m.PackageNotFoundError:\n    sys.exit(3)"
)


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


def tf_keras_installed(python: str | None = None, env: Mapping[str, str] | None = None) -> bool:
    """Whether the tf-keras distribution is installed: for this interpreter, or for the interpreter ``python``
    (a path), asked in a child process with ``env`` (its package metadata, as here: nothing imports TensorFlow).
    An interpreter that cannot answer (it does not start) gets this one's answer.

    Example:
        >>> import sys
        >>> tf_keras_installed(sys.executable) == tf_keras_installed()
        True
    """
    here = installed_version("tf-keras") is not None
    if python is None:
        return here
    try:
        code = subprocess.run(
            [python, "-c", _ASK_TF_KERAS], env=None if env is None else dict(env), capture_output=True, timeout=60
        ).returncode
    except (OSError, subprocess.TimeoutExpired):
        return here
    return code == 0 if code in (0, 3) else here


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
    """Why the installed stack is unsupported, or None if it is supported: a TensorFlow of tfdist's range with
    the tf-keras of its minor, or without tf-keras a Keras 3 from 3.10 (Keras 3 models need no tf-keras)."""
    tf_version, tf_keras = installed_version("tensorflow"), installed_version("tf-keras")
    if tf_version is None:
        return "TensorFlow is not installed: pip install 'tensorflow>=2.17,<2.22'."
    tf_minor = parse_version(tf_version)
    if not SUPPORTED_TF[0] <= tf_minor <= SUPPORTED_TF[1]:
        return (
            f"TensorFlow {tf_version} is outside tfdist's range 2.17-2.21 (2.16 stalls at the start of a "
            "multi-worker fit). Install e.g. tensorflow==2.21.0 tf-keras==2.21.0."
        )
    if tf_keras is None:
        keras3 = keras_version()
        if keras3 is not None and parse_version(keras3) >= KERAS3_MEASURED[0]:
            return None
        return (
            f"Neither tf-keras nor a Keras 3 from 3.10 is installed (keras: {keras3}): pip install "
            f"'{tf_keras_pin()}' for tf-keras models (`from tfdist import keras`), or 'keras>=3.10' for Keras 3 models."
        )
    if parse_version(tf_keras) != tf_minor:
        return (
            f"tf-keras {tf_keras} does not match TensorFlow {tf_version}: tf-keras must have TensorFlow's "
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
