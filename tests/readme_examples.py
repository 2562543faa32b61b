"""The README's runnable examples, read from README.md itself.

An example is a fenced ``sh`` or ``python`` block right after a line ``<!-- example: TARGET -->``
(TARGET is the make target it runs against: ``run``, ``run-grpc`` or ``run-zmq``); the fenced block after it is
what it prints. tests/e2e/test_readme_examples.py runs each one against the real target and compares.

Comparing: the values of fields that differ on every run (ids, timestamps) are not compared, and a
line ``...`` in the shown output stands for any number of lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
MARKER = re.compile(r"^<!-- example: (?P<target>[\w-]+) -->$")
FENCE = re.compile(r"^```(?P<lang>\w*)$")
DEFAULT_PORT = 30000
# Fields whose values are new on every run. Their values are blanked in both texts before comparing.
VOLATILE = ("id", "call_id", "item_id", "response_id", "created", "created_at", "completed_at", "system_fingerprint")
_VOLATILE_VALUE = re.compile(
    r'"(?P<key>' + "|".join(VOLATILE) + r')":(?P<space>\s*)(?:"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?|null)'
)
ANY_LINES = "..."


@dataclass(frozen=True)
class Example:
    target: str  # the make target: run, run-grpc or run-zmq
    lang: str  # sh or python
    code: str
    shown: str  # the output the README shows
    line: int  # where the example starts in README.md

    def for_port(self, port: int) -> str:
        """The code as written, against a gateway on ``port`` instead of the README's."""
        return self.code.replace(f"localhost:{DEFAULT_PORT}", f"localhost:{port}")


def _fenced_block(lines: list[str], start: int) -> tuple[str, str, int]:
    """The fenced block opening at or after ``start`` (blank lines skipped): (lang, text, next line)."""
    index = start
    while index < len(lines) and not lines[index].strip():
        index += 1
    opened = FENCE.match(lines[index]) if index < len(lines) else None
    if opened is None:
        raise ValueError(f"README.md:{index + 1}: an example needs a fenced block here")
    end = index + 1
    while end < len(lines) and lines[end] != "```":
        end += 1
    if end == len(lines):
        raise ValueError(f"README.md:{index + 1}: fenced block never closed")
    return opened["lang"], "\n".join(lines[index + 1 : end]), end + 1


def examples(text: str | None = None) -> list[Example]:
    lines = (README.read_text() if text is None else text).splitlines()
    found: list[Example] = []
    for number, line in enumerate(lines):
        marked = MARKER.match(line.strip())
        if marked is None:
            continue
        lang, code, after = _fenced_block(lines, number + 1)
        _, shown, _ = _fenced_block(lines, after)
        if lang not in ("sh", "python"):
            raise ValueError(f"README.md:{number + 1}: an example runs sh or python, not {lang!r}")
        found.append(Example(marked["target"], lang, code, shown, number + 1))
    return found


def normalised(text: str) -> list[str]:
    blanked = _VOLATILE_VALUE.sub(lambda m: f'"{m["key"]}":{m["space"]}*', text)
    return [line.rstrip() for line in blanked.strip().splitlines()]


def matches(shown: str, printed: str) -> bool:
    """Whether ``printed`` is what ``shown`` shows: line by line after :func:`normalised`, with
    ``...`` lines standing for any run of lines."""
    pattern = normalised(shown)
    actual = normalised(printed)

    def match(p: int, a: int) -> bool:
        if p == len(pattern):
            return a == len(actual)
        if pattern[p].strip() == ANY_LINES:
            return any(match(p + 1, rest) for rest in range(a, len(actual) + 1))
        return a < len(actual) and pattern[p] == actual[a] and match(p + 1, a + 1)

    return match(0, 0)
