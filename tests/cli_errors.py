"""The one check every bad-input test makes of a CLI result: one line on stderr, starting
`error:` and holding each fragment, the expected exit code, and no traceback."""

from __future__ import annotations

from typing import Any


def one_line_error(result: Any, *fragments: str, code: int = 2) -> str:
    """The error line of a CliRunner `result`, after asserting all of the above."""
    assert result.exit_code == code, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.output
    return lines[0]
