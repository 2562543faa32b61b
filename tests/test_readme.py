"""How README examples are read and compared (tests/readme_examples.py); the e2e test runs them."""

from __future__ import annotations

from tests.readme_examples import examples, matches

MARKED = """intro
<!-- example: run -->
```sh
curl -s localhost:30000/v1/models
```

```json
{"id": "chatcmpl-1", "created": 1, "content": "tok0"}
```
"""


def test_an_example_is_the_block_after_its_marker_and_the_block_after_that_is_its_output() -> None:
    [example] = examples(MARKED)
    assert (example.target, example.lang, example.line) == ("run", "sh", 2)
    assert example.for_port(41234) == "curl -s localhost:41234/v1/models"
    assert example.shown.startswith('{"id"')


def test_ids_and_times_are_not_compared_but_everything_else_is() -> None:
    shown = '{"id": "chatcmpl-1", "created": 1, "content": "tok0"}'
    assert matches(shown, '{"id": "chatcmpl-2", "created": 99, "content": "tok0"}')
    assert not matches(shown, '{"id": "chatcmpl-2", "created": 99, "content": "tok1"}')
    assert not matches(shown, '{"id": "chatcmpl-2", "created": 99, "content": "tok0"}\nextra')


def test_an_ellipsis_line_stands_for_any_lines() -> None:
    shown = "first\n...\nlast"
    assert matches(shown, "first\nlast")
    assert matches(shown, "first\na\nb\nlast")
    assert not matches(shown, "first\na\nb")


def test_the_readme_examples_parse() -> None:
    assert len(examples()) >= 5
