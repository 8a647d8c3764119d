"""tf-keras base classes, imported when a tfdist callback class is defined (not at ``import tfdist``)."""

from __future__ import annotations

from typing import Any


def callback_base() -> Any:
    """``tf_keras.callbacks.Callback``."""
    import tf_keras

    return tf_keras.callbacks.Callback


def backup_base() -> Any:
    """``tf_keras.callbacks.BackupAndRestore``."""
    import tf_keras

    return tf_keras.callbacks.BackupAndRestore
