"""The tool seam: the registry is the one list of tool names (the config refuses any other, naming the key), tools
are built from the config with their own call formats, and a turn's call goes to the tool whose call closed first."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from dapo.config import ConfigError, build_config
from dapo.config.schema import MultiTurnConfig
from dapo.tools.calculator import CalculatorTool
from dapo.tools.call_format import ToolCallFormat
from dapo.tools.python_tool import PythonTool
from dapo.tools.registry import TOOL_NAMES, TOOLS, build_tools, check_tool_names
from dapo.tools.result import ToolResult
from dapo.tools.toolbox import ToolCall, Toolbox

REPO = Path(__file__).resolve().parents[2]
PYTHON = ToolCallFormat()
CALCULATOR = ToolCallFormat(start="<calculator>", end="</calculator>", response_template="<result>{output}</result>")


def test_the_config_accepts_exactly_the_registered_names() -> None:
    (literal,) = typing.get_args(MultiTurnConfig.model_fields["tools"].annotation)
    assert set(typing.get_args(literal)) == set(TOOLS) == {"python", "calculator"}
    assert all(TOOLS[name].name == name for name in TOOL_NAMES)


def test_an_unknown_tool_is_refused_at_validation_naming_the_key_and_the_known_names() -> None:
    with pytest.raises(ConfigError) as info:
        build_config({}, ["rollout.multi_turn.tools=[python,abacus]"])
    message = str(info.value)
    assert "rollout.multi_turn.tools" in message and "abacus" in message
    assert "'python'" in message and "'calculator'" in message
    with pytest.raises(ConfigError, match="names a tool twice"):
        build_config({}, ["rollout.multi_turn.tools=[calculator,calculator]"])
    with pytest.raises(
        ValueError,
        match=r"rollout.multi_turn.tools: unknown tool\(s\) \['abacus'\]; choose from "
        r"\['python', 'calculator'\]",
    ):
        check_tool_names(["python", "abacus"])


def test_existing_keys_configure_the_python_tool_and_it_stays_the_default() -> None:
    from dapo.config import load_config

    cfg = load_config(
        REPO / "configs" / "tools" / "tiny_calculator.yaml", ["rollout.multi_turn.sandbox.mode=unsafe-no-isolation"]
    ).rollout.multi_turn
    assert cfg.tools == ["python"]
    (tool,) = build_tools(cfg)
    assert isinstance(tool, PythonTool)
    assert tool.call_format == ToolCallFormat(start="", end="=", response_template=" {output}\n")
    assert tool.sandbox.limits.wall_time_s == 5.0


def test_two_tools_are_built_in_the_configured_order_with_their_own_formats() -> None:
    mt = build_config(
        {}, ["rollout.multi_turn.tools=[calculator,python]", "rollout.multi_turn.sandbox.mode=unsafe-no-isolation"]
    ).rollout.multi_turn
    calculator, python = build_tools(mt)
    assert isinstance(calculator, CalculatorTool) and isinstance(python, PythonTool)
    assert (calculator.call_format, python.call_format) == (CALCULATOR, PYTHON)


class Recording:
    """A tool that records the codes it ran and answers with its name."""

    def __init__(self, name: str, call_format: ToolCallFormat) -> None:
        self.name, self.call_format, self.ran = name, call_format, []

    def run_many(self, codes, max_workers=1):
        self.ran.append(list(codes))
        return [ToolResult(f"{self.name}:{code}", "ok", 0, 0.0) for code in codes]


def test_the_call_that_closes_first_picks_its_tool() -> None:
    box = Toolbox([Recording("python", PYTHON), Recording("calculator", CALCULATOR)])
    calc_text = "Let me add. <calculator>2 + 2</calculator>"
    py_text = "Let me run.\n```python\nprint(3)\n```"
    assert box.first_closed_call(calc_text) == ToolCall(1, "2 + 2", len(calc_text))
    assert box.first_closed_call(py_text) == ToolCall(0, "print(3)", len(py_text))
    # both in one text: the earlier end marker wins, whichever tool is listed first
    assert box.first_closed_call(calc_text + " then " + py_text).tool == 1
    assert box.first_closed_call(py_text + " then " + calc_text).tool == 0
    assert box.first_closed_call("<calculator>2 + 2") is None and box.first_closed_call("```python\nx") is None
    assert box.any_open("<calculator>1") and box.any_open("```python") and not box.any_open("plain text")


def test_calls_run_on_their_own_tools_and_come_back_in_order() -> None:
    python, calculator = Recording("python", PYTHON), Recording("calculator", CALCULATOR)
    box = Toolbox([python, calculator])
    calls = [ToolCall(1, "1+1", 0), ToolCall(0, "print(1)", 0), ToolCall(1, "2*3", 0)]
    assert [r.output for r in box.run(calls, max_workers=2)] == ["calculator:1+1", "python:print(1)", "calculator:2*3"]
    assert (python.ran, calculator.ran) == ([["print(1)"]], [["1+1", "2*3"]])  # one run_many per tool
    with pytest.raises(ValueError, match="at least one tool"):
        Toolbox([])
