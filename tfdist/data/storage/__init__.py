"""Where records live: local paths, s3:// through boto3 or tensorflow-io, and staging for remote TF servers.

Modules: ``remote`` (one entry for every scheme), ``s3`` (the boto3 store), ``staging`` (the agent that copies
s3:// objects for datasets that run inside TF servers). Nothing here is public API: users pass paths to
:mod:`tfdist.data`, which reads and writes through these modules.
"""
