"""``python -m tfdist.launch.tasks.data_service``: a tf.data service dispatcher and workers in one process.

``tfdist-launch --data-service-workers N`` runs this next to the cluster and gives every task
``TFDIST_DATA_SERVICE=grpc://host:port``; pass that to ``TFRecordPipeline(data_service=...)``.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Sequence

from tfdist.errors import DataError, require_int
from tfdist.runtime import program

PROG = "python -m tfdist.launch.tasks.data_service"
MAX_WORKERS = 256


@program.cli_main(PROG)
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; serves until SIGTERM or Ctrl-C and returns the exit status."""
    parser = program.ArgumentParser(prog=PROG)
    parser.add_argument("--workers", type=int, default=1, help=f"service workers, 1 to {MAX_WORKERS}")
    parser.add_argument("--port", type=program.port_number, default=0, help="dispatcher port (0: pick a free one)")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address of this task that the workers report to the dispatcher"
    )
    args = parser.parse_args(argv)
    require_int(
        DataError,
        "--workers",
        args.workers,
        minimum=1,
        maximum=MAX_WORKERS,
        fix="Each service worker is a thread pool in this process; a few per machine are enough.",
    )
    from tfdist.data.service import LocalDataService  # Imports TensorFlow only once the flags are valid.

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with LocalDataService(num_workers=args.workers, host=args.host, port=args.port) as service:
        sys.stdout.write(f"tf.data service up at {service.address} with {args.workers} worker(s)\n")
        sys.stdout.flush()
        while not stop.wait(1.0):
            pass
    return 0


if __name__ == "__main__":
    from tfdist.runtime.clean_exit import exit_cleanly

    exit_cleanly(main)
