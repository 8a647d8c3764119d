"""Parsing serialized examples, decoding images, the hash bucket of a key."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Optional


def hash_bucket(value: Any, buckets: int) -> Any:
    """``fingerprint(str(value)) % buckets``: the same on every worker and every run."""
    import tensorflow as tf

    if value.dtype != tf.string:
        value = tf.strings.as_string(value)
    return tf.strings.to_hash_bucket_fast(tf.reshape(value, [-1])[0], buckets)


def key_filter(key: str, spec: Any, buckets: int, index: int) -> Callable[[Any], Any]:
    """A predicate on serialized records: keep those whose ``key`` hashes to ``index``."""
    import tensorflow as tf

    def keep(record: Any) -> Any:
        value = tf.io.parse_single_example(record, {key: spec})[key]
        return tf.equal(hash_bucket(value, buckets), index)

    return keep


def image_decoder(image_key: str, size: tuple[int, int], augment: bool,
                  seed: Optional[int]) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """Decodes ``image_key`` (JPEG or PNG bytes) to float32 in [0, 1] of ``size``."""
    import tensorflow as tf

    def decode(features: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(features)
        image = tf.io.decode_image(tf.reshape(features[image_key], []), channels=3, expand_animations=False)
        image = tf.image.resize(image, size)  # float32
        if augment:
            image = tf.image.random_flip_left_right(image, seed=seed)
        out[image_key] = image / 255.0
        return out

    return decode
