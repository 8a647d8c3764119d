"""The floors of tfdist, lowest first: a module may use its own floor and the floors below it, never one above.

"Use" means an import anywhere in the source (module level, inside a function, under ``TYPE_CHECKING``) or a
module named in a string (``python -m tfdist.launch.tasks.server``, ``mock.patch("tfdist.data...")``), since
a child process started by module name depends on that module as much as an import does. A module's floor is
that of its longest listed prefix; ``tests/test_layers.py`` enforces the rule and that the graph has no cycle.

The folders are the floors: ``runtime`` and ``errors`` at the bottom (with ``_options``, the option groups
specs are built from); ``cluster`` (pure Python, with ``plan``); ``strategy`` and ``comm`` (TensorFlow's
strategies and collectives); ``data``; ``launch`` (the supervisor, its engines, the emitted jobs and the
programs it starts in tasks); ``keras``; the tools (``testing``, ``stack``); ``cli`` on top, the only
package that parses user flags or prints.
"""

from __future__ import annotations

LAYERS: tuple[tuple[str, ...], ...] = (
    ("tfdist.errors", "tfdist._names", "tfdist._options", "tfdist._layers", "tfdist.runtime", "tfdist._compat"),
    ("tfdist.cluster", "tfdist.plan"),
    ("tfdist.strategy", "tfdist.comm", "tfdist.parallel"),
    ("tfdist.data",),
    ("tfdist.launch",),
    ("tfdist.keras",),
    ("tfdist.testing", "tfdist.stack"),
    ("tfdist.cli",),
    ("tfdist",),
)
