"""The Spark engine: each task in one task of a barrier stage.

Modules: ``engine`` (:class:`SparkEngine`, :class:`SparkOptions`), ``_session`` (the session and the slots a
stage needs), ``_boot`` (the first code an executor runs, standard library only), ``_task`` (one task inside
a barrier task) and ``_link`` (the driver's side of the wire). pyspark itself is imported only when the engine
places tasks. Users import these names from :mod:`tfdist.launch`.
"""

from tfdist.launch.engines.spark.engine import SparkEngine, SparkOptions

__all__ = ["SparkEngine", "SparkOptions"]
