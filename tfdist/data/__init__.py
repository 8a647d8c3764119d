"""tf.data TFRecord pipelines: sharded writing, per-worker sharding, stratified sampling, skew reports.

The Keras callback that adapts class weights while training is ``tfdist.keras.AdaptiveClassWeights``.
"""

from tfdist.data.pipeline.tfrecord import TFRecordPipeline
from tfdist.data.report import SkewReport, skew_report
from tfdist.data.sampling import resolve_weights, stratified_sample
from tfdist.data.service import LocalDataService
from tfdist.data.sharding import ShardPlan, plan_shards
from tfdist.data.records.writer import read_manifest, write_tfrecords

__all__ = ["LocalDataService", "ShardPlan", "SkewReport", "TFRecordPipeline", "plan_shards", "read_manifest",
           "resolve_weights", "skew_report", "stratified_sample", "write_tfrecords"]
