"""What several tests share: record builders, process checks, the programs and task bodies tasks run.

A task body only one test file runs sits beside that file instead (``tests/keras/_tasks_fit.py``).

``SUPPORT`` is this folder (task programs such as ``elastic_fake_train.py`` are started from it by path);
``REPO`` the repository root.
"""

from __future__ import annotations

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
REPO = SUPPORT.parents[1]
