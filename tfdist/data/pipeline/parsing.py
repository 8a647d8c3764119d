"""Serialized records -> features: a feature spec per batch (fast) or per record, images decoded.

Example:
    >>> import tensorflow as tf
    >>> from tfdist.data import ParseOptions
    >>> from tfdist.data.pipeline.parsing import parse_batch
    >>> example = tf.train.Example(features=tf.train.Features(feature={
    ...     "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[3]))}))
    >>> options = ParseOptions(features={"y": tf.io.FixedLenFeature([], tf.int64)})
    >>> parse_batch(tf.constant([example.SerializeToString()]), options, seed=None)["y"].numpy().tolist()
    [3]
"""

from __future__ import annotations

from typing import Any

from tfdist.data.pipeline import _decode
from tfdist.data.pipeline.options import ParseOptions
from tfdist.errors import DataError, Error, invalid


def parse_elements(records: Any, parse: ParseOptions, *, seed: int | None, deterministic: bool) -> Any:
    """Per record: the user's ``parse_fn``, or parse (and decode) one example at a time."""
    import tensorflow as tf

    if parse.parse_fn is not None:
        return records.map(parse.parse_fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
    features = parse.features
    parsed = records.map(
        lambda r: tf.io.parse_single_example(r, features),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=deterministic,
    )
    if parse.image_key is not None:
        decode = _decode.image_decoder(parse.image_key, parse.image_size, parse.augment, seed)  # type: ignore
        parsed = parsed.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
    return parsed


def parse_batch(records: Any, parse: ParseOptions, *, seed: int | None) -> Any:
    """A batch of serialized records -> a batch of features, images decoded."""
    import tensorflow as tf

    features = tf.io.parse_example(records, parse.features)
    if parse.image_key is not None:
        assert parse.image_size is not None  # ParseOptions requires image_key and image_size together.
        decode = _decode.image_decoder(
            parse.image_key,
            parse.image_size,
            parse.augment,
            seed,
            scale=False,
        )
        key = parse.image_key
        features[key] = (
            tf.map_fn(lambda image: decode({key: image})[key], features[key], fn_output_signature=tf.float32) / 255.0
        )  # One op per batch, not per image.
    return features


def split_label(features: Any, label_key: str) -> tuple[dict[str, Any], Any]:
    """(features without the label, label): one ``fit`` pair."""
    return {k: v for k, v in features.items() if k != label_key}, features[label_key]


def supervised(dataset: Any, label_key: str) -> Any:
    """(features without the label, label) pairs for ``fit``."""
    return dataset.map(lambda f: split_label(f, label_key))


def check_features(path: str, compression: str, parse: ParseOptions, *, num_classes: int | None = None) -> None:
    """Parses the first record of ``path`` with the feature spec; a mismatch is a DataError naming the feature.

    TensorFlow reports a missing key, a wrong dtype or shape deep inside the
    running pipeline, without the file. One record up front names both.

    Raises:
      DataError: A feature is missing or does not parse as specified, or the
        label is outside ``[0, num_classes)``.
    """
    import tensorflow as tf

    if parse.features is None:
        return
    from tfdist.data.records import _framing
    from tfdist.data.storage import remote

    local = "://" not in path and not compression
    try:
        if local:  # Read without building a tf.data pipeline (~25 ms of tracing).
            first = [_framing.first_record(path)]
            first = first if first[0] is not None else []
        else:
            first = list(tf.data.TFRecordDataset(remote.readable_path(path), compression_type=compression).take(1))
    except (tf.errors.OpError, OSError, Error):
        return  # Damaged or unreadable: the framing check and the reader report it with their own words.
    if not first:
        return
    records = tf.reshape(first[0], [1])
    try:
        values = tf.io.parse_example(records, dict(parse.features))  # Every feature at once; one by one on error.
    except (tf.errors.InvalidArgumentError, ValueError, TypeError):
        if local and _framing.first_record(path, check_data=True) is None:
            return  # A damaged record, not a wrong spec: the reader reports it.
        values = None
    for key, spec in parse.features.items():
        try:
            value = values[key] if values is not None else tf.io.parse_example(records, {key: spec})[key]
        except (tf.errors.InvalidArgumentError, ValueError, TypeError) as err:
            reason = getattr(err, "message", str(err)).split("\n")[0]
            raise invalid(
                DataError,
                f"features[{key!r}]",
                spec,
                f"a spec that parses the records of {path} ({reason})",
                "Check the feature's name, dtype and shape against the data, e.g. "
                "with tf.train.Example.FromString(record).",
            ) from err
        if (
            key == parse.label_key
            and num_classes is not None
            and isinstance(value, tf.Tensor)
            and value.dtype.is_integer
        ):
            labels = [int(v) for v in value.numpy().reshape(-1)]
            if any(not 0 <= v < num_classes for v in labels):
                raise invalid(
                    DataError,
                    "num_classes",
                    num_classes,
                    f"more than every label of `{key}` (found {labels} in {path})",
                    "Pass the true number of classes.",
                )
