"""tf.data TFRecord pipelines: sharded writing, per-worker sharding, stratified sampling, skew reports.

:class:`TFRecordPipeline` validates its options in six groups, its attributes ``source``
(:class:`SourceOptions`), ``sharding`` (:class:`ShardOptions`), ``parsing`` (:class:`ParseOptions`),
``sampling`` (:class:`SampleOptions`), ``epochs`` (:class:`EpochOptions`) and ``tuning``
(:class:`TuningOptions`); it takes each field as a keyword argument, or a whole group by name. The Keras
callback that adapts class weights while training is ``tfdist.keras.AdaptiveClassWeights``.

Example:
    >>> from tfdist.data import EpochOptions, TFRecordPipeline
    >>> pipeline = TFRecordPipeline(files="/data/train-*", parse_fn=len, epochs=EpochOptions(batch_size=64))
    >>> pipeline.batch_size, pipeline.epochs == EpochOptions(batch_size=64)
    (64, True)
"""

from tfdist.data.order import DataPosition, EpochOrder, InputCursor
from tfdist.data.pipeline import (
    EpochOptions,
    ParseOptions,
    ResumableInput,
    SampleOptions,
    ShardOptions,
    SourceOptions,
    TFRecordPipeline,
    TuningOptions,
)
from tfdist.data.records import FileInfo, Listing, VerifyReport, read_manifest, row_example, write_tfrecords
from tfdist.data.report import ScanProgress, SkewReport, skew_report
from tfdist.data.sampling import resolve_weights, stratified_sample
from tfdist.data.service import LocalDataService
from tfdist.data.sharding import ShardPlan, plan_shards

__all__ = [
    "DataPosition",
    "EpochOptions",
    "EpochOrder",
    "FileInfo",
    "InputCursor",
    "Listing",
    "LocalDataService",
    "ParseOptions",
    "ResumableInput",
    "SampleOptions",
    "ScanProgress",
    "ShardOptions",
    "ShardPlan",
    "SkewReport",
    "SourceOptions",
    "TFRecordPipeline",
    "TuningOptions",
    "VerifyReport",
    "plan_shards",
    "read_manifest",
    "resolve_weights",
    "row_example",
    "skew_report",
    "stratified_sample",
    "write_tfrecords",
]
