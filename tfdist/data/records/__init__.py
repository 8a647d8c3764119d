"""TFRecord files on disk: writing sharded sets with a manifest, listing them, and checking their framing.

Modules: ``writer`` (:func:`tfdist.data.write_tfrecords`, manifests), ``files`` (listings), ``verify`` and
``_framing`` (record headers and CRCs, walked without TensorFlow).
"""
