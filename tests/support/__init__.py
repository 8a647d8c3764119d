"""What the tests share: record builders, the programs tests start in tasks, and where they live.

``SUPPORT`` is this folder (task programs such as ``elastic_fake_train.py`` are started from it by path);
``REPO`` the repository root.
"""

from __future__ import annotations

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
REPO = SUPPORT.parents[1]
