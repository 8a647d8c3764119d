"""A record index: built once (``tfdist index``), read by pipelines in the same order as the files themselves,
under MWMS-style sharding and as parameter-server claims, without listing or walking the files."""

from __future__ import annotations

import pytest
import tensorflow as tf

from tests.support.records import ID_ONLY, example
from tfdist.cli.main import main
from tfdist.data import DataPosition, TFRecordPipeline, write_tfrecords
from tfdist.data.records.index import open_index
from tfdist.errors import DataError

RECORDS = 250


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("indexed")
    prefix = str(root / "part")
    write_tfrecords((example(i) for i in range(RECORDS)), prefix, num_shards=7)
    out = {"files": prefix + "-*"}
    for grid in (1, 3):  # 3: seeks land between located records and skip to them.
        out[f"grid{grid}"] = str(root / f"grid{grid}.tfindex")
        assert main(["index", prefix + "-*", "--out", out[f"grid{grid}"], "--grid", str(grid)]) == 0
    return out


def _ids(dataset) -> list[int]:
    return [int(i) for batch in dataset for i in batch["id"]]


def _pipeline(files: str, **options) -> TFRecordPipeline:
    return TFRecordPipeline(files=files, batch_size=12, features=ID_ONLY, shuffle_buffer=16, seed=5, **options)


@pytest.mark.parametrize("grid", [1, 3])
def test_an_index_reads_the_files_order_without_listing_them(data, grid, monkeypatch) -> None:
    from tfdist.data.records import files

    def shares(source: str) -> list[list[int]]:  # The whole epoch, then 2 'data' workers resumed at step 5.
        out = [_ids(_pipeline(source, order_block=4).dataset())]
        for worker in range(2):
            pipe = _pipeline(source, order_block=4, shard_policy="data", order_streams=6)
            pipe.start_at(DataPosition(step=5))
            context = tf.distribute.InputContext(
                num_input_pipelines=2, input_pipeline_id=worker, num_replicas_in_sync=2
            )
            out.append(_ids(pipe.dataset(context)))
        return out

    listed = _pipeline(data["files"], order_block=4)
    listed.dataset()
    expected = shares(data["files"])
    assert sorted(expected[0]) == list(range(RECORDS)) and all(expected)
    monkeypatch.setattr(files, "_glob", lambda pattern: pytest.fail(f"listed {pattern}"))
    assert shares(data[f"grid{grid}"]) == expected
    indexed = _pipeline(data[f"grid{grid}"], order_block=4)
    indexed.dataset()
    assert indexed.fingerprint() == listed.fingerprint() is not None  # One order: a backup resumes either way.


@pytest.mark.parametrize("grid", [1, 3])
@pytest.mark.parametrize("by_range", [False, True])
def test_claimed_steps_from_an_index_are_the_listings_steps(data, grid, by_range, monkeypatch) -> None:
    from tfdist.data.order import claims

    strategy = tf.distribute.get_strategy()
    by_listing = _pipeline(data["files"]).claimed_dataset_fn(strategy)
    assert by_listing is not None
    expected = [sorted(int(i) for i in batch["id"]) for batch in by_listing(None)]
    if by_range:  # Names and offsets read from the index a piece at a time, not held in the graph.
        monkeypatch.setattr(claims, "MAX_BLOCKS", 0)
    by_index = _pipeline(data[f"grid{grid}"]).claimed_dataset_fn(strategy)
    assert by_index is not None
    assert [sorted(int(i) for i in batch["id"]) for batch in by_index(None)] == expected
    assert sorted(i for step in expected for i in step) == list(range(RECORDS))


def test_an_index_lists_its_files_for_options_that_need_the_listing(data) -> None:
    index = open_index(data["grid1"])
    assert int(index.counts.sum()) == RECORDS and len(index.paths) == 7
    buffered = _pipeline(data["grid1"], order="buffer")
    assert sorted(_ids(buffered.dataset())) == list(range(RECORDS)) and buffered.fingerprint() is None


def test_a_missing_index_names_the_command_that_builds_it(tmp_path) -> None:
    with pytest.raises(DataError, match="tfdist index") as err:
        _ids(_pipeline(str(tmp_path / "none.tfindex")).dataset())
    assert err.value.field == "files"
