"""TFRecord files on disk: writing sharded sets with a manifest, listing them, and checking their framing.

Modules: ``writer`` (:func:`tfdist.data.write_tfrecords`, manifests) with ``_staging`` (shards written
aside, then moved into place in one step), ``dataframe`` (a Spark DataFrame's
partitions written by its executors), ``files`` (listings), ``verify`` and
``_framing`` (record headers and CRCs, walked without TensorFlow). The public names are re-exported here and
from :mod:`tfdist.data`.
"""

from tfdist.data.records.dataframe import row_example
from tfdist.data.records.files import FileInfo, Listing
from tfdist.data.records.verify import VerifyReport
from tfdist.data.records.writer import read_manifest, write_tfrecords

__all__ = ["FileInfo", "Listing", "VerifyReport", "read_manifest", "row_example", "write_tfrecords"]
