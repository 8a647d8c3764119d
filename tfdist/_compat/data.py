"""tf.data internals: TFRecord readers from byte offsets, unbatch/rebatch without normalizing maps,
dataset functions instantiated on one device, and interleave functions traced once per process."""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Any

from tfdist._compat._common import _missing

_INTS_ON_DEVICE = "experimental_ints_on_device"  # FunctionLibraryDefinition::kIntsOnDeviceAttr.
_SCOPE = threading.local()
_INSTALL = threading.Lock()
_INSTALLED: list[bool] = []
_TRACED: OrderedDict[Hashable, Any] = OrderedDict()  # (key, input spec, scope) -> StructuredFunctionWrapper
_TRACED_MAX = 64
_TRACED_LOCK = threading.Lock()


@contextlib.contextmanager
def single_device_functions() -> Iterator[None]:
    """The dataset functions traced inside (``map``, ``flat_map``, ``interleave``... and the functions
    nested in them) are instantiated on the device that runs them, not as multi-device functions.

    tf.data instantiates every function of a dataset for every new iterator (Keras makes one per epoch,
    and a nested dataset one per element). As multi-device functions each pays TF's placement and a
    Grappler run, ~5-15 ms per function per iterator on 2 cores (BENCHMARKS.md). A function whose
    ``FunctionDef`` carries ``experimental_ints_on_device`` (as TF's own prefetch-to-device functions do)
    is instantiated on its one device. Meant for input functions that run on a host CPU; only datasets
    built in this thread inside the block are affected. TF's public transformations take no function
    attributes, so the first use wraps ``StructuredFunctionWrapper.__init__`` once to add it when a
    block is active (it passes ``defun_kwargs`` through otherwise unchanged).

    Example:
        >>> import tensorflow as tf
        >>> with single_device_functions():
        ...     dataset = tf.data.Dataset.range(3).map(lambda x: x * 2)
        >>> [int(x) for x in dataset]
        [0, 2, 4]
    """
    _install()
    depth = getattr(_SCOPE, "depth", 0)
    _SCOPE.depth = depth + 1
    try:
        yield
    finally:
        _SCOPE.depth = depth


def marked_single_device(dataset: Any) -> dict[str, bool]:
    """Each function of ``dataset`` (nested ones too) by name: whether it is instantiated on one device."""
    import tensorflow as tf

    graph = tf.raw_ops.DatasetToGraphV2(input_dataset=dataset._variant_tensor, external_state_policy=0)
    definition = tf.compat.v1.GraphDef()
    definition.ParseFromString(graph.numpy())
    return {
        f.signature.name: bool(f.attr[_INTS_ON_DEVICE].b) if _INTS_ON_DEVICE in f.attr else False
        for f in definition.library.function
    }


def _install() -> None:
    with _INSTALL:
        if _INSTALLED:
            return
        needed = "tensorflow.python.data.ops.structured_function.StructuredFunctionWrapper(defun_kwargs=)"
        try:
            from tensorflow.python.data.ops import structured_function
        except ImportError:
            raise _missing(needed, "resumable input") from None
        wrapper = getattr(structured_function, "StructuredFunctionWrapper", None)
        original = getattr(wrapper, "__init__", None)
        if original is None or "defun_kwargs" not in inspect.signature(original).parameters:
            raise _missing(needed, "resumable input")
        position = list(inspect.signature(original).parameters).index("defun_kwargs")

        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            if getattr(_SCOPE, "depth", 0) and len(args) < position:  # Not passed by position (TF never does).
                kwargs["defun_kwargs"] = {_INTS_ON_DEVICE: True, **(kwargs.get("defun_kwargs") or {})}
            original(self, *args, **kwargs)

        setattr(wrapper, "__init__", __init__)  # noqa: B010 (a class attribute mypy cannot see assigned)
        _INSTALLED.append(True)


def tfrecord_reader(filenames: Any, compression: str, buffer_size: int) -> Any:
    """The records of ``filenames`` (a string tensor: one file, or a 1-D list read one file after the other).

    TF's bare reader, no traced function of its own: ``tf.data.TFRecordDataset``
    wraps it in a ``flat_map`` over a dataset of names, ~7 ms of tracing per
    reader outside a function, and a second nested function per file inside one.
    """
    try:
        from tensorflow.python.data.ops.readers import _TFRecordDataset
    except ImportError:
        raise _missing("tensorflow.python.data.ops.readers._TFRecordDataset", "reading local files") from None
    return _TFRecordDataset(filenames, compression_type=compression, buffer_size=buffer_size)


def tfrecord_reader_at(filename: Any, offset: Any, compression: str, buffer_size: int) -> Any:
    """The records of one file from byte ``offset`` on (a record boundary; 0 for compressed files).

    ``filename`` and ``offset`` may also be 1-D: the files one after the other, each from its offset.
    TF's ``TFRecordDatasetV2`` op takes byte offsets since 2.13; the public
    ``tf.data.TFRecordDataset`` does not pass them (2.17 to 2.21).
    """
    import tensorflow as tf

    try:
        from tensorflow.python.data.ops import dataset_ops
        from tensorflow.python.ops import gen_dataset_ops
    except ImportError:
        raise _missing("tensorflow.python.data.ops.dataset_ops.DatasetSource", "resumable input") from None

    class _At(dataset_ops.DatasetSource):
        def __init__(self) -> None:
            variant = gen_dataset_ops.tf_record_dataset_v2(
                tf.reshape(tf.convert_to_tensor(filename, tf.string), [-1]),
                tf.convert_to_tensor(compression, tf.string),
                tf.convert_to_tensor(buffer_size, tf.int64),
                tf.reshape(tf.convert_to_tensor(offset, tf.int64), [-1]),
            )
            super().__init__(variant)

        @property
        def element_spec(self) -> Any:
            return tf.TensorSpec([], tf.string)

    return _At()


def unbatch_dense(dataset: Any) -> Any:
    """``dataset.unbatch()`` for elements of dense tensors only, without its normalizing ``map``.

    The public ``unbatch`` first maps every element through a function that
    turns sparse and ragged parts dense (a no-op for dense tensors, traced,
    ~5 ms, and one more stage per element).
    """
    import tensorflow as tf

    if not all(isinstance(spec, tf.TensorSpec) for spec in tf.nest.flatten(dataset.element_spec)):
        return dataset.unbatch()
    try:
        from tensorflow.python.data.ops.unbatch_op import _UnbatchDataset
    except ImportError:
        raise _missing("tensorflow.python.data.ops.unbatch_op._UnbatchDataset", "stratified sampling") from None
    return _UnbatchDataset(dataset)


def rebatch_dense(dataset: Any, batch_size: int, *, drop_remainder: bool = False) -> Any:
    """``dataset.rebatch(batch_size)`` for elements of dense tensors only, without its normalizing ``map``.

    As with :func:`unbatch_dense`: the public ``rebatch`` first maps every element through a traced no-op
    for dense tensors (one function to trace and instantiate, and one more stage per element).
    """
    import tensorflow as tf

    if not all(isinstance(spec, tf.TensorSpec) for spec in tf.nest.flatten(dataset.element_spec)):
        return dataset.rebatch(batch_size, drop_remainder=drop_remainder)
    try:
        from tensorflow.python.data.ops import dataset_ops
        from tensorflow.python.ops import gen_experimental_dataset_ops
    except ImportError:
        raise _missing("tensorflow.python.data.ops.dataset_ops.UnaryDataset", "resumable input") from None

    class _Rebatched(dataset_ops.UnaryDataset):
        def __init__(self) -> None:
            self._input_dataset = dataset
            size = batch_size if drop_remainder else None
            self._spec = tf.nest.map_structure(
                lambda spec: tf.TensorSpec([size, *spec.shape[1:]], spec.dtype), dataset.element_spec
            )
            variant = gen_experimental_dataset_ops.rebatch_dataset_v2(
                dataset._variant_tensor,
                batch_sizes=tf.constant([batch_size], tf.int64),
                drop_remainder=tf.constant(drop_remainder),
                **self._flat_structure,
            )
            super().__init__(dataset, variant)

        @property
        def element_spec(self) -> Any:
            return self._spec

    return _Rebatched()


def _traced(dataset: Any, func: Callable[..., Any], key: Hashable) -> Any:
    """``func``'s tf.data function for ``dataset``'s elements, traced once per key (none captured inputs)."""
    from tensorflow.python.data.ops import structured_function

    full = (key, dataset.element_spec, getattr(_SCOPE, "depth", 0) > 0)
    with _TRACED_LOCK:
        wrapper = _TRACED.get(full)
        if wrapper is not None:
            _TRACED.move_to_end(full)
            return wrapper
    wrapper = structured_function.StructuredFunctionWrapper(func, "Dataset.interleave()", dataset=dataset)
    if not wrapper.function.captured_inputs:  # Only a function with no tensors of this build is reusable.
        with _TRACED_LOCK:
            _TRACED[full] = wrapper
            while len(_TRACED) > _TRACED_MAX:
                _TRACED.popitem(last=False)
    return wrapper


def cached_interleave(
    dataset: Any, func: Callable[..., Any], *, key: Hashable, cycle_length: int, parallel: bool
) -> Any:
    """``dataset.interleave(func, cycle_length, block_length=1, ...)`` (deterministic; AUTOTUNE threads if
    ``parallel``) whose function is traced once per ``key`` in a process, not once per dataset.

    Building a dataset traces every Python function of it into a graph again, however often the same
    one was traced before (a reader of several nested stages: ~10-20 ms of Python per build). ``key``
    names everything the function's graph depends on besides its input; a function that captures
    tensors of the build (not reusable) is traced every time, as TF does.

    Example:
        >>> import tensorflow as tf
        >>> twice = lambda x: tf.data.Dataset.from_tensors(x).repeat(2)
        >>> first = cached_interleave(tf.data.Dataset.range(2), twice, key="twice", cycle_length=2, parallel=False)
        >>> again = cached_interleave(tf.data.Dataset.range(3), twice, key="twice", cycle_length=1, parallel=True)
        >>> [int(x) for x in first], [int(x) for x in again]
        ([0, 1, 0, 1], [0, 0, 1, 1, 2, 2])
    """
    import tensorflow as tf

    needed = "tensorflow.python.data.ops: UnaryDataset, StructuredFunctionWrapper and the interleave ops"
    try:
        from tensorflow.python.data.ops import dataset_ops
        from tensorflow.python.ops import gen_dataset_ops
    except ImportError:
        raise _missing(needed, "resumable input") from None
    if not all(hasattr(gen_dataset_ops, op) for op in ("parallel_interleave_dataset_v4", "interleave_dataset")):
        raise _missing(needed, "resumable input")
    wrapper = _traced(dataset, func, key)

    class _Interleaved(dataset_ops.UnaryDataset):
        def __init__(self) -> None:
            self._input_dataset, self._map_func, self._name = dataset, wrapper, None
            self._structure = wrapper.output_structure._element_spec
            cycle, block = tf.constant(cycle_length, tf.int64), tf.constant(1, tf.int64)
            captured = wrapper.function.captured_inputs
            if parallel:
                auto = tf.constant(tf.data.AUTOTUNE, tf.int64)
                variant = gen_dataset_ops.parallel_interleave_dataset_v4(
                    dataset._variant_tensor, captured, cycle, block, auto, auto, auto,
                    f=wrapper.function, deterministic="true", **self._common_args,
                )  # fmt: skip
            else:
                variant = gen_dataset_ops.interleave_dataset(
                    dataset._variant_tensor, captured, cycle, block, f=wrapper.function, **self._common_args
                )
            super().__init__(dataset, variant)

        def _functions(self) -> list[Any]:
            return [self._map_func]

        @property
        def element_spec(self) -> Any:
            return self._structure

    return _Interleaved()
