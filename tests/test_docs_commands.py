"""Every ``tfdist`` and ``tfdist-launch`` command line shown in README.md and docs/*.md parses (issue 26 item 14).

Lines are taken from ```bash blocks, backslash continuations joined, cut at the first shell operator
(``>``, ``|``, ``&&``, ``;``) and after ``#``; optional parts written ``[--flag value]`` count as given.
A line with a placeholder (``...``, ``<...>``, ``CMD``) is not a command line. Parsing is all that runs:
flags, choices, the "would be ignored" check of tfdist-launch; nothing is started.
"""

from __future__ import annotations

import contextlib
import io
import pathlib
import re
import shlex

import pytest

from tfdist.cli import launch as launch_cli
from tfdist.cli import main as tfdist_cli
from tfdist.runtime import program

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(?:bash|sh|console)[ \t]*\n(?P<code>.*?)^```[ \t]*$", re.S | re.M)
_PLACEHOLDER = re.compile(r"\.\.\.|<[A-Za-z_ -]+>|\bCMD\b")


def _command_lines() -> list[tuple[str, list[str]]]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for block in _FENCE.finditer(text):
            first = text.count("\n", 0, block.start()) + 2
            lines = block.group("code").replace("\\\n", " ").split("\n")
            for offset, line in enumerate(lines):
                words = shlex.shlex(line.replace("[", " ").replace("]", " "), posix=True, punctuation_chars=True)
                words.whitespace_split, words.commenters = True, "#"
                try:
                    tokens = list(words)
                except ValueError:
                    continue
                cut = next((i for i, t in enumerate(tokens) if t and set(t) <= set("><|&;")), len(tokens))
                argv = tokens[:cut]
                if argv[:1] in (["tfdist"], ["tfdist-launch"]) and not _PLACEHOLDER.search(line):
                    found.append((f"{page.name}:{first + offset}", argv))
    return found


COMMANDS = _command_lines()


def test_the_docs_show_command_lines() -> None:
    assert len(COMMANDS) >= 20, COMMANDS  # The extraction works: the pages show dozens of them.


@pytest.mark.parametrize("argv", [argv for _, argv in COMMANDS], ids=[where for where, _ in COMMANDS])
def test_command_line_parses(argv: list[str]) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            if argv[0] == "tfdist-launch":
                own, _command = program.split_command(argv[1:])
                parser = launch_cli._parser()
                launch_cli._refuse_idle_flags(parser, parser.parse_args(own))
            else:
                tfdist_cli.parser().parse_args(argv[1:])
        except SystemExit as exit:
            assert exit.code == 0, f"{shlex.join(argv)}: {err.getvalue()}"


_INDEX_INSTALL = re.compile(r"""pip install ['"]?tfdist\b(?!-)|['"]tfdist\[[a-z,]+\]['"]""")


def test_no_page_or_message_installs_tfdist_from_a_package_index() -> None:
    # tfdist installs from a clone or a wheel built in one (docs/install.md); `pip install tfdist` or
    # 'tfdist[s3]' would ask an index that does not have it. Library messages use versions.install_hint.
    sources = PAGES + sorted((ROOT / "tfdist").rglob("*.py")) + sorted((ROOT / "tests").rglob("*.py"))
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sources
        if path.name != "test_docs_commands.py"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if _INDEX_INSTALL.search(line)
    ]
    assert not found, "\n".join(found)
