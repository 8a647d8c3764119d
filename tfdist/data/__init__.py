"""tf.data TFRecord pipelines: sharded writing, per-worker sharding, stratified sampling, skew reports."""

from tfdist.data.pipeline import TFRecordPipeline
from tfdist.data.sampling import resolve_weights, stratified_sample
from tfdist.data.sharding import ShardPlan, plan_shards
from tfdist.data.writer import read_manifest, write_tfrecords

__all__ = ["ShardPlan", "TFRecordPipeline", "plan_shards", "read_manifest", "resolve_weights", "stratified_sample",
           "write_tfrecords"]
