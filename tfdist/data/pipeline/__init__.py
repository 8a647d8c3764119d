"""The TFRecord input pipeline: options, reading, parsing, stratified reading and batching.

:class:`TFRecordPipeline` validates its options in six groups (``SourceOptions``, ``ShardOptions``,
``ParseOptions``, ``SampleOptions``, ``EpochOptions``, ``TuningOptions``), re-exported here with it; users
import them from :mod:`tfdist.data`. :class:`ResumableInput` is what tfdist's Keras callbacks ask of a pipeline
to resume it (:mod:`tfdist.data.pipeline.state`).
"""

from tfdist.data.pipeline.options import (
    EpochOptions,
    ParseOptions,
    SampleOptions,
    ShardOptions,
    SourceOptions,
    TuningOptions,
)
from tfdist.data.pipeline.state import ResumableInput
from tfdist.data.pipeline.tfrecord import TFRecordPipeline

__all__ = [
    "EpochOptions",
    "ParseOptions",
    "ResumableInput",
    "SampleOptions",
    "ShardOptions",
    "SourceOptions",
    "TFRecordPipeline",
    "TuningOptions",
]
