"""A finite epoch reads every record exactly once: every shard policy, worker count, odd batch and compression."""

from __future__ import annotations

import collections
import logging
import os
from pathlib import Path

import pytest
import tensorflow as tf

from tests.support.records import FEATURES, example
from tests.support.records import ids as _ids
from tfdist.data import TFRecordPipeline, write_tfrecords


def _example(i: int) -> tf.train.Example:
    return example(i, i % 3)


RECORDS = 601  # Prime: no batch size or worker count divides it.


@pytest.fixture(scope="module")
def prefixes(tmp_path_factory: pytest.TempPathFactory) -> dict[str | None, str]:
    """The same 601 records written once per compression, shared by the module's tests."""
    root = tmp_path_factory.mktemp("once")
    prefixes = {}
    for compression in (None, "GZIP", "ZLIB"):
        prefix = os.path.join(root, str(compression).lower())
        write_tfrecords((_example(i) for i in range(RECORDS)), prefix, num_shards=8, compression=compression)
        prefixes[compression] = prefix
    return prefixes


@pytest.mark.parametrize("policy", ("file", "data", "hash", "auto"))
@pytest.mark.parametrize("workers", (2, 3, 4))
@pytest.mark.parametrize("compression", (None, "GZIP", "ZLIB"))
def test_every_record_once(prefixes: dict[str | None, str], policy: str, workers: int, compression: str) -> None:
    batch = 7 * workers  # Per replica 7: divides neither the data nor any worker's share.
    pipeline = TFRecordPipeline(
        files=f"{prefixes[compression]}-*",
        features=FEATURES,
        batch_size=batch,
        shard_policy=policy,
        shard_key="id",
        shuffle_buffer=50,
        seed=workers,
    )
    seen = [i for worker in range(workers) for i in _ids(pipeline, workers, worker)]
    assert len(seen) == RECORDS
    assert len(set(seen)) == RECORDS
    assert set(seen) == set(range(RECORDS))


@pytest.mark.parametrize(
    "compression",
    [
        pytest.param(None, id="plain"),
        pytest.param("GZIP", id="gzip"),
    ],
)
def test_off_gives_every_worker_everything_once(prefixes: dict[str | None, str], compression: str) -> None:
    pipeline = TFRecordPipeline(
        files=f"{prefixes[compression]}-*", features=FEATURES, batch_size=22, shard_policy="off"
    )
    for worker in range(2):
        seen = _ids(pipeline, 2, worker)
        assert (len(seen), set(seen)) == (RECORDS, set(range(RECORDS)))


def test_parse_fn_path_keeps_the_partial_batch(prefixes: dict[str | None, str]) -> None:
    pipeline = TFRecordPipeline(
        files=f"{prefixes[None]}-*",
        batch_size=50,
        num_epochs=2,
        parse_fn=lambda r: tf.io.parse_single_example(r, FEATURES)["id"],
    )
    values = [int(v) for b in pipeline.dataset() for v in b.numpy()]
    assert collections.Counter(values) == collections.Counter({i: 2 for i in range(RECORDS)})


def test_batch_larger_than_the_data_still_reads_it(prefixes: dict[str | None, str]) -> None:
    pipeline = TFRecordPipeline(files=f"{prefixes[None]}-*", features=FEATURES, batch_size=10_000)
    batches = [b["id"].numpy() for b in pipeline.dataset()]
    assert [len(b) for b in batches] == [RECORDS]


# drop_remainder=True is an explicit choice, and what it drops is logged with the count.


@pytest.mark.parametrize(
    "parse_fn",
    [
        pytest.param(False, id="features"),
        pytest.param(True, id="parse_fn"),
        pytest.param("tuple", id="parse_fn_tuple"),  # tf.data hands a tuple's parts as separate arguments.
    ],
)
def test_dropped_records_are_logged_with_their_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, parse_fn: bool | str
) -> None:
    prefix = os.path.join(tmp_path, "d")
    write_tfrecords((_example(i) for i in range(103)), prefix, num_shards=2)

    def as_tuple(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        example = tf.io.parse_single_example(record, FEATURES)
        return example["id"], example["id"] * 2

    kwargs = {"parse_fn": lambda r: tf.io.parse_single_example(r, FEATURES)} if parse_fn else {"features": FEATURES}
    if parse_fn == "tuple":
        kwargs = {"parse_fn": as_tuple}
    pipeline = TFRecordPipeline(files=f"{prefix}-*", batch_size=20, drop_remainder=True, **kwargs)
    with caplog.at_level(logging.WARNING, logger="tfdist.data"):
        batches = [b if isinstance(b, dict) else {"id": b[0], "twice": b[1]} for b in pipeline.dataset()]
    assert [len(b["id"]) for b in batches] == [20] * 5
    assert batches[0]["id"].shape == (20,)  # Still a static batch after the filter.
    if parse_fn == "tuple":
        assert all((b["twice"].numpy() == 2 * b["id"].numpy()).all() for b in batches)
    logged = [r for r in caplog.records if r.name.startswith("tfdist.data") and r.levelno >= logging.WARNING]
    dropped = [r.getMessage() for r in logged if "drops its last partial batch" in r.getMessage()]
    assert len(dropped) == 1
    assert "3 record(s) not read" in dropped[0]


def test_static_batch_shape_is_static(tmp_path: Path) -> None:
    prefix = os.path.join(tmp_path, "s")
    write_tfrecords((_example(i) for i in range(40)), prefix, num_shards=1)
    static = TFRecordPipeline(files=f"{prefix}-*", features=FEATURES, batch_size=8, drop_remainder=True)
    partial = TFRecordPipeline(files=f"{prefix}-*", features=FEATURES, batch_size=8)
    assert static.dataset().element_spec["id"].shape.as_list() == [8]
    assert partial.dataset().element_spec["id"].shape.as_list() == [None]


def test_nothing_logged_when_the_batch_divides(tmp_path: Path) -> None:
    prefix = os.path.join(tmp_path, "e")
    write_tfrecords((_example(i) for i in range(40)), prefix, num_shards=1)
    pipeline = TFRecordPipeline(files=f"{prefix}-*", features=FEATURES, batch_size=8, drop_remainder=True)
    logger = logging.getLogger("tfdist.data")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign, assignment]
    logger.addHandler(handler)
    try:
        assert sum(len(b["id"]) for b in pipeline.dataset()) == 40
    finally:
        logger.removeHandler(handler)
    assert not [r for r in records if "drops" in r.getMessage()]


if __name__ == "__main__":
    pytest.main([__file__])
