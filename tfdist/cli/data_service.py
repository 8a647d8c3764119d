"""``python -m tfdist.cli.data_service``: a tf.data service dispatcher and workers in one process.

``tfdist-launch --data-service-workers N`` runs this next to the cluster and gives every task
``TFDIST_DATA_SERVICE=grpc://host:port``; pass that to ``TFRecordPipeline(data_service=...)``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from tfdist.data.service import LocalDataService


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tfdist.cli.data_service")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--port", type=int, default=0, help="dispatcher port (0: pick a free one)")
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with LocalDataService(num_workers=args.workers, port=args.port) as service:
        sys.stdout.write(f"tf.data service up at {service.address} with {args.workers} worker(s)\n")
        sys.stdout.flush()
        while not stop.wait(1.0):
            pass
    return 0


if __name__ == "__main__":
    from tfdist.clean_exit import exit_cleanly

    exit_cleanly(main)
