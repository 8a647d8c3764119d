"""tf.data service: move parsing and decoding off the trainers, onto service workers.

:class:`LocalDataService` starts an in-process dispatcher and workers, for
tests, demos and ``tfdist-launch``; a pipeline with
``data_service="grpc://host:port"`` sends its processing there.

Example::

    from tfdist.data.service import LocalDataService
    with LocalDataService(num_workers=2) as service:
        pipeline = TFRecordPipeline(..., data_service=service.address)   # "grpc://localhost:PORT"
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from tfdist._compat import stop_data_server
from tfdist.cluster import address as _address
from tfdist.errors import DataError, ServiceError, require_int

__all__ = ["LocalDataService"]


class LocalDataService:
    """A tf.data service dispatcher plus ``num_workers`` workers in this process.

    Args:
      num_workers: Service workers (each runs pipeline processing).
      host: Address the workers report to the dispatcher.
      port: Dispatcher port; 0 picks a free one.
    """

    def __init__(self, *, num_workers: int = 1, host: str = "127.0.0.1", port: int = 0) -> None:
        require_int(DataError, "num_workers", num_workers, minimum=1)
        require_int(DataError, "port", port, minimum=0, maximum=65535, fix="0 picks a free port.")
        self.num_workers = num_workers
        self.host = host
        self.port = port
        self._dispatcher: Any = None
        self._workers: list[Any] = []

    @property
    def address(self) -> str:
        """``grpc://host:port`` of the dispatcher (for ``TFRecordPipeline(data_service=...)``)."""
        if self._dispatcher is None:
            raise ServiceError("The data service is not started; use `with LocalDataService(...) as service:`.")
        return self._dispatcher.target

    def start(self) -> LocalDataService:
        import tensorflow as tf

        from tfdist.data.storage.staging import ensure_agent

        ensure_agent()  # Its workers read s3:// objects through boto3 where TF has no s3 file system.
        service = tf.data.experimental.service
        port = self.port or _address.free_ports(1, self.host)[0]
        self._dispatcher = service.DispatchServer(service.DispatcherConfig(port=port))
        dispatcher = self._dispatcher.target.split("://")[1]
        for _ in range(self.num_workers):
            self._workers.append(
                service.WorkerServer(
                    service.WorkerConfig(dispatcher_address=dispatcher, worker_address=f"{self.host}:%port%")
                )
            )
        return self

    def stop(self) -> None:
        for worker in self._workers:
            stop_data_server(worker)
        if self._dispatcher is not None:
            stop_data_server(self._dispatcher)
        self._workers, self._dispatcher = [], None

    def __enter__(self) -> LocalDataService:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
