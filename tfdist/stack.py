"""What TensorFlow stack is installed, which remote schemes work through what, and the known traps.

``tfdist doctor --stack`` prints :meth:`StackReport.to_text`. :func:`stack_report`
reads package metadata only, unless ``probe=True``, which imports TensorFlow to
ask which file systems are registered and resolves every private internal
tfdist uses (``tfdist._compat.check_internals``).

Example:
    >>> from tfdist.stack import stack_report
    >>> report = stack_report()
    >>> report.tensorflow is not None and "s3" in report.schemes
    True
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys

from tfdist import _compat
from tfdist._compat.checks import SKIPPED
from tfdist._compat.keras3 import OLD_KERAS
from tfdist._compat.keras_optional import KERAS3_HELPERS
from tfdist.errors import StackError
from tfdist.runtime import versions

_TFIO_ONLY = ("hdfs", "az", "oss", "http")
_TRUE = ("1", "true", "True")  # What TensorFlow takes for TF_USE_LEGACY_KERAS on.


@dataclasses.dataclass(frozen=True, kw_only=True)
class StackReport:
    """The installed stack and what it can do.

    Attributes:
      python, tensorflow, tf_keras, keras, tensorboard, tensorflow_io, boto3:
        Installed versions (None: not installed). ``keras`` is the ``keras``
        distribution (Keras 3 on TF >= 2.16).
      tf_use_legacy_keras: ``$TF_USE_LEGACY_KERAS`` (None: unset).
      keras3_imported: The Keras 3 version this process has imported, if any.
      keras3_range: Where the installed Keras 3 stands against the versions measured right on several
        replicas ('' without Keras 3).
      schemes: Remote scheme -> what serves it ('TensorFlow', 'tensorflow-io',
        'boto3 (tfdist)') or 'unavailable: why'.
      internals: 'ok: N resolve', the StackError's text, or 'not probed'.
      keras3_fit: What Keras 3's fit does under multi-worker strategies here ('not probed' without a probe).
      problems: Why this stack is unsupported (empty: supported).
      warnings: Known traps that apply here.
    """

    python: str
    tensorflow: str | None
    tf_keras: str | None
    keras: str | None
    tensorboard: str | None
    tensorflow_io: str | None
    boto3: str | None
    tf_use_legacy_keras: str | None
    keras3_imported: str | None
    schemes: dict[str, str]
    internals: str
    problems: tuple[str, ...]
    warnings: tuple[str, ...]
    keras3_fit: str = "not probed"
    keras3_range: str = ""

    @property
    def ok(self) -> bool:
        """Whether tfdist supports this stack."""
        return not self.problems

    def to_text(self) -> str:
        """The report as ``tfdist doctor --stack`` prints it."""

        def show(value: str | None) -> str:
            return value if value is not None else "not installed"

        lines = [
            f"python:             {self.python}",
            f"tensorflow:         {show(self.tensorflow)}",
            f"tf-keras:           {show(self.tf_keras)}",
            f"keras (Keras 3):    {show(self.keras)}"
            + (f" - {self.keras3_range}" if self.keras3_range else "")
            + (f" - imported by this process ({self.keras3_imported})" if self.keras3_imported else ""),
            f"TF_USE_LEGACY_KERAS: {self.tf_use_legacy_keras if self.tf_use_legacy_keras is not None else 'unset'}",
            f"tensorboard:        {show(self.tensorboard)}",
            f"tensorflow-io:      {show(self.tensorflow_io)}",
            f"boto3:              {show(self.boto3)}",
            "remote schemes:",
        ]
        lines += [f"  {scheme + '://':<10} {how}" for scheme, how in self.schemes.items()]
        lines.append(f"internals:          {self.internals}")
        lines.append(f"Keras 3 fit:        {self.keras3_fit}")
        lines += [f"PROBLEM: {p}" for p in self.problems] + [f"warning: {w}" for w in self.warnings]
        lines.append("stack: supported" if self.ok else "stack: NOT supported")
        return "\n".join(lines)


def _keras_warnings(
    tf_keras: str | None, keras: str | None, legacy: str | None, keras3_imported: str | None
) -> list[str]:
    out = []
    keras3 = keras is not None and versions.parse_version(keras) >= (3, 0)
    if tf_keras is None:
        out.append(
            f"tf-keras is not installed: Keras 3 models (`import keras`) train under tfdist.build_strategy, with "
            f"tfdist.keras's {KERAS3_HELPERS}; tf-keras models (`from tfdist import keras`), the other helpers "
            f"and parameter-server fit need it: pip install '{versions.tf_keras_pin()}'."
        )
        if legacy in _TRUE:
            out.append(
                f"TF_USE_LEGACY_KERAS is {legacy}, but tf-keras is not installed: tf.keras fails to import "
                "('Keras cannot be imported'). Unset it; tfdist-launch sets it only where tf-keras is installed."
            )
    elif keras3 and legacy != "1":
        out.append(
            "tf.keras is Keras 3 here (TF_USE_LEGACY_KERAS is not 1): tfdist's Keras helpers (`from tfdist import "
            "keras`) are tf-keras's, and Keras 3 has no ParameterServerStrategy fit. Use `from tfdist import "
            "keras`, or set TF_USE_LEGACY_KERAS=1 before importing TensorFlow (tfdist-launch sets it)."
        )
    if keras is not None and (3, 0) <= versions.parse_version(keras) < versions.KERAS3_MEASURED[0]:
        out.append(
            f"keras {keras} is older than 3.10: {OLD_KERAS}. tfdist refuses its fit under strategies "
            "of several replicas: pip install 'keras==3.15.1'."
        )
    if keras3_imported:
        out.append(
            f"this process imported Keras 3 ({keras3_imported}); tfdist.build_strategy fixes its fit under "
            "MultiWorkerMirroredStrategy (Keras >= 3.10) and refuses it under ParameterServerStrategy."
        )
    return out


def _warnings(tf: str | None, tensorboard: str | None, tfio: str | None) -> list[str]:
    out = []
    if tf is not None and tensorboard is None:
        out.append(
            "tensorboard is not installed (TF >= 2.21 no longer installs it): tf-keras' TensorBoard callback "
            "fails inside fit. pip install tensorboard."
        )
    if tf is not None and tfio is not None and versions.parse_version(tf) > versions.TFIO_LAST_TF:
        out.append(
            f"tensorflow-io {tfio} is installed, but its file systems cannot load on TF {tf} (undefined "
            "symbols on TF >= 2.18): s3:// goes through boto3; hdfs/az need TF 2.17 or a mount."
        )
    return out


def keras3_range(keras: str | None) -> str:
    """Where Keras ``keras`` stands against the Keras 3 versions measured right on several replicas ('' when it
    is not Keras 3); package metadata only.

    Example:
        >>> keras3_range("3.15.1"), keras3_range("2.17.0")
        ('in the range measured right (3.10 to 3.15)', '')
    """
    if keras is None or versions.parse_version(keras) < (3, 0):
        return ""
    first, last = versions.KERAS3_MEASURED
    measured = f"{first[0]}.{first[1]} to {last[0]}.{last[1]}"
    if versions.parse_version(keras) < first:
        return f"older than the range measured right ({measured}): refused under strategies of several replicas"
    if versions.parse_version(keras) <= last:
        return f"in the range measured right ({measured})"
    return (
        f"newer than the range measured right ({measured}): fixed where the names the fixes replace resolve "
        "(Keras 3 fit, below)"
    )


def _schemes(probe: bool) -> dict[str, str]:
    tfio_problem = versions.tfio_unavailable_reason()
    boto3 = importlib.util.find_spec("boto3") is not None
    if not probe:
        s3 = (
            "tensorflow-io"
            if tfio_problem is None
            else ("boto3 (tfdist)" if boto3 else f"unavailable: {versions.install_hint('s3')}")
        )
        out = {"gs": "TensorFlow", "s3": s3}
        out.update({s: "tensorflow-io" if tfio_problem is None else f"unavailable: {tfio_problem}" for s in _TFIO_ONLY})
        return out
    from tfdist.data.storage import remote
    from tfdist.errors import Error

    out = {}
    for scheme in ("gs", "s3") + _TFIO_ONLY:
        try:
            reader = remote.reader_for(f"{scheme}://bucket/x")
            if reader == "boto3":
                remote.ensure_filesystem(f"{scheme}://bucket/x")
                out[scheme] = "boto3 (tfdist)"
            else:
                out[scheme] = "TensorFlow" if scheme in remote.BUILTIN_SCHEMES else "tensorflow-io"
        except Error as err:
            out[scheme] = f"unavailable: {str(err).split('. ')[0]}"
    return out


def stack_report(*, probe: bool = False) -> StackReport:
    """The installed stack; ``probe`` also imports TensorFlow, checks file systems and internals."""
    version = versions.installed_version
    tf, keras, legacy = version("tensorflow"), versions.keras_version(), os.environ.get("TF_USE_LEGACY_KERAS")
    tf_keras = version("tf-keras")
    tensorboard, tfio = version("tensorboard"), version("tensorflow-io")
    keras3_imported = versions.keras3_loaded()  # Before probing, which may import Keras 3 itself.
    problem = versions.stack_problem()
    problems = [problem] if problem else []
    if tf is not None and versions.parse_version(tf) == (2, 16):
        problems.append("TF 2.16 stalls ~7.5 s at the start of every 2-worker MWMS fit (BUILD_NOTES.md).")
    internals = keras3_fit = "not probed (tfdist doctor --stack probes)"
    if probe and problems:
        internals = "not probed: the stack has a problem (below)"
    elif probe:
        internals = _internals(problems)
    if probe and tf is not None and keras3_range(keras):
        keras3_fit = _keras3_fit(problems)
    return StackReport(
        python=".".join(map(str, sys.version_info[:3])),
        tensorflow=tf,
        tf_keras=tf_keras,
        keras=keras,
        tensorboard=tensorboard,
        tensorflow_io=tfio,
        boto3=version("boto3"),
        tf_use_legacy_keras=legacy,
        keras3_imported=keras3_imported,
        schemes=_schemes(probe and tf is not None),
        internals=internals,
        problems=tuple(problems),
        warnings=tuple(_keras_warnings(tf_keras, keras, legacy, keras3_imported) + _warnings(tf, tensorboard, tfio)),
        keras3_fit=keras3_fit,
        keras3_range=keras3_range(keras),
    )


def _internals(problems: list[str]) -> str:
    """What ``check_internals`` says, in a line; its StackError joins ``problems``."""
    try:
        checked = _compat.check_internals()
    except StackError as err:
        problems.append(str(err))
        return str(err)
    skipped = sum(value != "ok" for value in checked.values())
    resolved = f"ok: all {len(checked)} private TF/tf-keras/Keras 3 internals resolve"
    if skipped:
        resolved = (
            f"ok: {len(checked) - skipped} private TF/Keras 3 internals resolve ({skipped} of tf-keras: {SKIPPED})"
        )
    return resolved


def _keras3_fit(problems: list[str]) -> str:
    """What ``check_keras3`` says of the installed Keras 3; its StackError joins ``problems`` (once)."""
    try:
        return _compat.check_keras3()
    except StackError as err:
        if str(err) not in problems:
            problems.append(str(err))
        return str(err)
