"""The TFRecord input pipeline: options, reading, parsing, stratified reading and batching.

:class:`TFRecordPipeline` validates its options in six groups (``SourceOptions``, ``ShardOptions``,
``ParseOptions``, ``SampleOptions``, ``EpochOptions``, ``TuningOptions``), re-exported here with it; users
import them from :mod:`tfdist.data`.
"""

from tfdist.data.pipeline.options import (
    EpochOptions,
    ParseOptions,
    SampleOptions,
    ShardOptions,
    SourceOptions,
    TuningOptions,
)
from tfdist.data.pipeline.tfrecord import TFRecordPipeline

__all__ = [
    "EpochOptions",
    "ParseOptions",
    "SampleOptions",
    "ShardOptions",
    "SourceOptions",
    "TFRecordPipeline",
    "TuningOptions",
]
