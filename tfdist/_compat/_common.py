"""What every accessor shares: the StackError of a missing internal, and attribute access that raises it."""

from __future__ import annotations

from typing import Any

from tfdist.errors import StackError
from tfdist.runtime.versions import stack_text


def _missing(what: str, needed_by: str) -> StackError:
    return StackError(
        f"tfdist needs {what} for {needed_by}, which {stack_text()} does not have. tfdist supports "
        "TensorFlow 2.17-2.21 with the tf-keras of the same minor version; install one of those, or "
        "report the version at tfdist's issue tracker.",
        field="stack",
        value=stack_text(),
        expected=what,
        fix="pip install 'tensorflow>=2.17,<2.22' and the matching tf-keras",
    )


def _attr(obj: Any, name: str, needed_by: str) -> Any:
    try:
        return getattr(obj, name)
    except AttributeError:
        raise _missing(f"{type(obj).__name__}.{name}", needed_by) from None
