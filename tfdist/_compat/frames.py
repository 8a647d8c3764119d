"""Which Python frames are TensorFlow's, and which run the Python of a ``tf.py_function``: TF's file layout.

The step watchdog (:mod:`tfdist.runtime.watchdog`) reads a task's stacks: a thread whose innermost frames
are in the imported ``tensorflow`` package is inside a TensorFlow call, and a thread that went through
``tensorflow/python/ops/script_ops.py`` runs a ``tf.py_function`` (or ``tf.numpy_function``) body, which TF
calls from one of its own threads. That file is private layout, checked on every stack by
:func:`check_py_function_file` (``tfdist doctor --stack``).

Example:
    >>> PY_FUNCTION_FILE.split("/")[-3:]
    ['python', 'ops', 'script_ops.py']
"""

from __future__ import annotations

import os
import sys

from tfdist._compat._common import _missing

# Relative to the tensorflow package: where TF calls a py_function's Python from (FuncRegistry, EagerFunc).
PY_FUNCTION_FILE = os.path.join("python", "ops", "script_ops.py")


def tensorflow_prefix() -> str | None:
    """The directory of the imported ``tensorflow`` package, with a trailing separator; None before its import.

    Every frame of TensorFlow's Python code has a file name that starts with it.
    """
    module = sys.modules.get("tensorflow")
    path = getattr(module, "__file__", None)
    return os.path.dirname(path) + os.sep if path else None


def check_py_function_file() -> None:
    """StackError unless the installed TensorFlow calls py_function bodies from :data:`PY_FUNCTION_FILE`."""
    import tensorflow as tf

    prefix = tensorflow_prefix()
    if prefix is None or tf.py_function.__module__ != "tensorflow.python.ops.script_ops":
        raise _missing("tf.py_function in tensorflow/python/ops/script_ops.py", "the stall inspector")
    if not os.path.isfile(prefix + PY_FUNCTION_FILE):
        raise _missing(PY_FUNCTION_FILE, "the stall inspector")
