"""Text that goes into a log line (one line, whatever it holds) or a file name.

Standard library only (the agent uses it on bare hosts). Messages come from
trainers, agents and result calls that we do not trust to be well-behaved:
a newline in one could forge a line of its own (`ok\\n2026-12-01 08:00:00
succeeded`), a carriage return could hide what came before it on a
terminal, a NUL could cut it short. Every control character is written
escaped, so a log line is exactly one line of what was said.
"""

import re

__all__ = ["one_line", "slug"]

# C0 controls, DEL, C1 controls, and the Unicode line and paragraph separators.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: "re.Match[str]") -> str:
    char = match.group(0)
    return _NAMED.get(char) or ("\\x%02x" % ord(char) if ord(char) < 0x100 else "\\u%04x" % ord(char))


def one_line(text: str) -> str:
    """`text` with every control character escaped (`\\n`, `\\r`, `\\x00`, `\\u2028`...)."""
    return _CONTROL.sub(_escape, text)


def slug(name: str) -> str:
    """A file-name-safe form of a name (a scheme's, a trainer's)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")
    return cleaned or "schema"
