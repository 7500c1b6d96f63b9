"""How a tool call looks in the model's text and how its result is shown: each tool owns one, and the multi-turn
rollout picks the tool whose call closed (dapo.tools.toolbox), never a tool's name."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToolCallFormat:
    """How a tool call looks in the model's text and how its result is shown.

    start/end: a call is the text after the last ``start`` of the turn up to the first ``end`` after it (``start``
        may be empty: the whole turn so far is the code).
    response_template: the tool output's text, ``{output}`` replaced by what the code printed.
    """

    start: str = "```python"
    end: str = "```"
    response_template: str = "\n```output\n{output}\n```\n"

    def __post_init__(self) -> None:
        if not self.end:
            raise ValueError("ToolCallFormat.end must be a non-empty string (it ends a call)")
        if "{output}" not in self.response_template:
            raise ValueError("ToolCallFormat.response_template must contain {output}")

    def closed_call(self, text: str) -> tuple[str, int] | None:
        """The code of the first closed call in ``text`` and the text's length up to its end marker, or None."""
        begin = text.find(self.start) if self.start else 0
        if begin < 0:
            return None
        body = begin + len(self.start)
        close = text.find(self.end, body)
        if close < 0:
            return None
        return text[body:close].strip("\n"), close + len(self.end)

    def is_open(self, text: str) -> bool:
        """Whether ``text`` (a turn) has opened a call of this format (an empty start: always)."""
        return not self.start or self.start in text

    def response_halves(self) -> tuple[str, str]:
        """The template's text before and after ``{output}`` (the rollout encodes each alone: token in, token out)."""
        before, after = self.response_template.split("{output}", 1)
        return before, after
