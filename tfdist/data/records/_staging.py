"""The staging of a write: :func:`~tfdist.data.write_tfrecords` is all or nothing because of it."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable
from typing import Any

from tfdist.errors import StorageError


class Staging:
    """Where shards are written before they replace the old dataset in one step.

    TF file systems: a hidden directory beside the prefix, moved into place by
    rename. Objects served through boto3: local files, uploaded on commit.
    """

    def __init__(self, path_prefix: str) -> None:
        import tensorflow as tf

        from tfdist.data.storage import remote

        self._remote = remote
        self._boto = remote.reader_for(path_prefix) == "boto3"
        self._finish: dict[str, Any] = {}
        parent, _, base = path_prefix.rpartition("/")
        self.dir = f"{parent or '.'}/.{base}.tfdist-staging-{uuid.uuid4().hex[:12]}"
        if not self._boto:
            try:
                tf.io.gfile.makedirs(self.dir)
            except tf.errors.OpError as err:
                raise StorageError(
                    f"Cannot write under {parent or '.'}: {err.message}. Check the path and permissions."
                ) from err

    def path(self, final: str) -> str:
        """Where the shard ``final`` is written first."""
        if self._boto:
            local, finish = self._remote.writable_path(final)
            self._finish[final] = (local, finish)
            return local
        return f"{self.dir}/{final.rpartition('/')[2]}"

    def commit(self, finals: Iterable[str], manifest: dict[str, Any], manifest_file: str) -> None:
        """Moves every staged shard to its final name, then writes the manifest."""
        import tensorflow as tf

        for final in finals:
            if self._boto:
                self._finish[final][1]()
            else:
                tf.io.gfile.rename(self.path(final), final, overwrite=True)
        if self._boto:
            with self._remote.open_file(manifest_file, "w") as f:
                json.dump(manifest, f, indent=1, sort_keys=True)
            return
        staged = f"{self.dir}/manifest.json"
        with tf.io.gfile.GFile(staged, "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
        tf.io.gfile.rename(staged, manifest_file, overwrite=True)

    def discard(self) -> None:
        """Removes whatever is still staged."""
        import tensorflow as tf

        if self._boto:
            for local, _ in self._finish.values():
                if os.path.exists(local):
                    os.unlink(local)
        elif tf.io.gfile.exists(self.dir):
            tf.io.gfile.rmtree(self.dir)
