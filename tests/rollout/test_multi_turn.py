"""Multi-turn tool rollouts on the shipped tiny model with both engines (HF, and vLLM where it is installed).

The tiny model writes ``7 + 5 = 12`` lines, so these tests call the tool with a format it produces: a call is the
turn's text up to ``=`` (the code ``7 + 5``), the sandbox prints ``12``, and the model continues after the output.
The reference for every log-prob is one teacher-forced fp32 pass of the Hugging Face model over prompt + the whole
trajectory (tool tokens included, as context); the bound is the single-turn contract's (tests/rollout/
test_engine_contract.py: 1e-4, measured gaps < 1e-5, a real mismatch moves log-probs by 1e-2 or more).
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

import dapo
from dapo.data.synth import generate_synth_problems, synth_records
from dapo.rollout.base import RolloutEngine, SamplingParams
from dapo.rollout.hf_engine import HFRolloutEngine
from dapo.rollout.multi_turn import MultiTurnOutput, MultiTurnParams, MultiTurnRollout, ToolCallFormat
from dapo.rollout.spec import EngineSpec
from dapo.rollout.vllm_engine import VLLMRolloutEngine, vllm_available
from dapo.tools.sandbox import PythonSandbox, SandboxLimits, ToolResult, bwrap_problem
from tests.harness.engines import ScriptedEngine
from tests.harness.tokenizers import WordTokenizer

ASSET = Path(dapo.__file__).parent / "assets" / "tiny-qwen2"
ATOL = 1e-4
UP_TO_EQUALS = ToolCallFormat(start="", end="=")
TEMPLATE_PARTS = UP_TO_EQUALS.response_template.split("{output}")
pytestmark = pytest.mark.skipif(not (ASSET / "model.safetensors").exists(), reason="tiny model not built yet")


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(ASSET, local_files_only=True)


@pytest.fixture(scope="module")
def hf_model() -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(ASSET, local_files_only=True, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts(tokenizer: PreTrainedTokenizerBase) -> list[list[int]]:
    rows = synth_records(generate_synth_problems(4, seed=11))
    return [
        list(tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False))
        for r in rows
    ]


@pytest.fixture(scope="module", params=["hf", "vllm"])
def engine(
    request: pytest.FixtureRequest, hf_model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> Iterator[RolloutEngine]:
    if request.param == "hf":
        built: RolloutEngine = HFRolloutEngine(
            hf_model, eos_token_ids=int(tokenizer.eos_token_id), pad_token_id=int(tokenizer.pad_token_id)
        )
    else:
        ok, reason = vllm_available()
        if not ok:
            pytest.skip(reason)
        built = VLLMRolloutEngine(
            ASSET,
            EngineSpec(name="vllm", dtype="float32", seed=0, max_model_len=256),
            eos_token_ids=int(tokenizer.eos_token_id),
        )
    yield built
    built.close()


@pytest.fixture(scope="module")
def sandbox() -> PythonSandbox:
    return PythonSandbox(SandboxLimits(wall_time_s=20.0), mode="unsafe-no-isolation")


def rollout(engine, tokenizer, runner, **params) -> MultiTurnRollout:
    return MultiTurnRollout(engine, tokenizer, runner, MultiTurnParams(call_format=UP_TO_EQUALS, **params))


def segments(mask: list[int]) -> list[tuple[int, int, int]]:
    """(value, start, end) runs of the action mask."""
    runs, start = [], 0
    for value, group in itertools.groupby(mask):
        length = len(list(group))
        runs.append((value, start, start + length))
        start += length
    return runs


def test_log_probs_of_model_tokens_match_a_teacher_forced_pass_over_the_trajectory(
    engine: RolloutEngine,
    hf_model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[int]],
    sandbox: PythonSandbox,
) -> None:
    out = rollout(engine, tokenizer, sandbox, max_assistant_turns=3, max_response_length=96).generate(
        prompts, SamplingParams(n=2, temperature=1.0, seed=3, prompt_seeds=(5, 6, 7, 8))
    )
    assert isinstance(out, MultiTurnOutput) and len(out) == 8
    assert sum(out.tool_calls) >= 4, "the tiny model writes 'a + b =' lines: most samples call the tool"
    worst = 0.0
    for k in range(len(out)):
        ids, mask = out.response_ids[k], torch.tensor(out.action_mask[k], dtype=torch.bool)
        full = torch.tensor([prompts[out.prompt_index[k]] + ids])
        with torch.no_grad():
            logits = hf_model(full).logits[0, len(full[0]) - len(ids) - 1 : -1]
        expected = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
        worst = max(worst, (torch.tensor(out.logprobs[k]) - expected)[mask].abs().max().item())
        assert all(lp == 0.0 for lp, m in zip(out.logprobs[k], out.action_mask[k]) if not m)
    assert worst < ATOL, f"max |engine - teacher-forced| over model tokens = {worst:.2e}"


def test_tool_output_is_appended_as_encoded_tokens_and_the_mask_marks_it(
    engine: RolloutEngine, tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]], sandbox: PythonSandbox
) -> None:
    out = rollout(engine, tokenizer, sandbox, max_assistant_turns=3, max_response_length=96).generate(
        prompts, SamplingParams(n=2, seed=4, prompt_seeds=(1, 2, 3, 4))
    )
    before, after = (tokenizer.encode(t, add_special_tokens=False) for t in TEMPLATE_PARTS)
    for k in range(len(out)):
        ids, mask = out.response_ids[k], out.action_mask[k]
        runs = segments(mask)
        tool_runs = [(a, b) for value, a, b in runs if value == 0]
        assert len(tool_runs) == out.tool_calls[k] <= 2 and out.turns[k] == len(tool_runs) + 1
        assert runs[0][0] == 1  # a trajectory starts with the model
        for a, b in tool_runs:
            code = tokenizer.decode(ids[:a]).rsplit("```\n", 1)[-1].split("=")[0]  # this turn's text before '='
            printed = str(eval(code.strip())) if code.strip() else ""  # what the sandbox printed for it
            # token in/out: exactly the pieces encoded alone, never the trajectory re-tokenised
            assert ids[a:b] == before + tokenizer.encode(printed, add_special_tokens=False) + after
            assert tokenizer.decode(ids[a - 1 : a]).endswith("=")  # the call ended on the model's '=' token
        assert len(ids) <= 96


def test_a_call_in_the_last_turn_is_not_run_and_the_turn_ends_at_its_marker(
    engine: RolloutEngine, tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]], sandbox: PythonSandbox
) -> None:
    out = rollout(engine, tokenizer, sandbox, max_assistant_turns=1, max_response_length=64).generate(
        prompts, SamplingParams(seed=1)
    )
    for k in range(len(out)):
        assert out.tool_calls[k] == 0 and all(out.action_mask[k])
        text = tokenizer.decode(out.response_ids[k])
        if "=" in text:
            assert text.endswith("=") and out.finish_reason[k] == "stop"


def test_the_trajectory_budget_counts_tool_tokens_and_ends_in_length(
    engine: RolloutEngine, tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]], sandbox: PythonSandbox
) -> None:
    out = rollout(engine, tokenizer, sandbox, max_assistant_turns=4, max_response_length=14).generate(
        prompts, SamplingParams(n=2, seed=2)
    )
    assert all(len(ids) <= 14 for ids in out.response_ids)
    for ids, reason in zip(out.response_ids, out.finish_reason):
        assert (reason == "length") == (len(ids) == 14)
    assert "length" in out.finish_reason


class RewritingRunner:
    """Runs, in the real sandbox, the given hostile programs in place of what the model wrote (the model itself
    cannot be made to write them on demand)."""

    def __init__(self, sandbox: PythonSandbox, programs: Sequence[str]) -> None:
        self.sandbox, self.programs, self.calls = sandbox, itertools.cycle(programs), 0

    def run_many(self, codes: Sequence[str], max_workers: int = 4) -> list[ToolResult]:
        self.calls += len(codes)
        return self.sandbox.run_many([next(self.programs) for _ in codes], max_workers=max_workers)


HOSTILE = (
    "while True:\n    pass",
    "import os\nwhile True:\n    os.fork()",
    "x = bytearray(1 << 40)",
    "while True:\n    print('y' * 4096)",
    "print(open('/etc/passwd').read())",
    "open('/tmp/dapo-mt-escape', 'w').write('x')",
    "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)",
    "import os\nos._exit(7)",
    "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
)


def test_hostile_code_in_every_call_is_contained_and_the_rollout_finishes(
    hf_model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]]
) -> None:
    engine = HFRolloutEngine(
        hf_model, eos_token_ids=int(tokenizer.eos_token_id), pad_token_id=int(tokenizer.pad_token_id)
    )
    # The isolation where this host has it; the unsafe mode's audit hook turns these naive programs away otherwise.
    mode = "bwrap" if bwrap_problem(sys.executable) is None else "unsafe-no-isolation"
    runner = RewritingRunner(
        PythonSandbox(SandboxLimits(wall_time_s=1.5, cpu_time_s=1.0, max_output_bytes=2048), mode=mode), HOSTILE
    )
    out = rollout(
        engine,
        tokenizer,
        runner,
        max_assistant_turns=3,
        max_response_length=128,
        max_tool_response_length=24,
        max_parallel_calls=4,
    ).generate(prompts * 3, SamplingParams(n=1, seed=0, prompt_seeds=tuple(range(12))))
    categories = [c for per_sample in out.tool_categories for c in per_sample]
    assert runner.calls == len(categories) >= len(HOSTILE)
    assert "ok" not in categories and {"timeout", "memory", "output_limit", "error"} <= set(categories)
    assert not Path("/tmp/dapo-mt-escape").exists()
    for ids, mask in zip(out.response_ids, out.action_mask):  # every tool output was cut to its cap
        assert all(
            b - a <= 24 + sum(len(tokenizer.encode(t, add_special_tokens=False)) for t in TEMPLATE_PARTS)
            for value, a, b in segments(mask)
            if value == 0
        )


def test_tool_outputs_are_cut_to_their_token_cap_on_the_chosen_side(
    tokenizer: PreTrainedTokenizerBase, hf_model: PreTrainedModel
) -> None:
    engine = HFRolloutEngine(
        hf_model, eos_token_ids=int(tokenizer.eos_token_id), pad_token_id=int(tokenizer.pad_token_id)
    )
    text = " ".join(str(i) for i in range(100))
    before, after = (tokenizer.encode(t, add_special_tokens=False) for t in TEMPLATE_PARTS)
    for side in ("left", "right", "middle"):
        mt = rollout(engine, tokenizer, None, max_tool_response_length=10, tool_response_truncate_side=side)
        tokens = mt.tool_tokens(text)
        body = tokens[len(before) : len(tokens) - len(after)]
        assert len(body) == 10 and tokens[: len(before)] == before and tokens[len(tokens) - len(after) :] == after
        decoded = tokenizer.decode(body)
        assert "..." in decoded
        assert decoded.startswith("0") == (side != "left") and decoded.endswith("99") == (side != "right")
    short = rollout(engine, tokenizer, None).tool_tokens("42\n")
    assert short == before + tokenizer.encode("42", add_special_tokens=False) + after


def test_the_default_format_finds_a_fenced_python_block() -> None:
    fmt = ToolCallFormat()
    assert fmt.closed_call("Let me compute.\n```python\nprint(2 ** 10)\n") is None
    text = "Let me compute.\n```python\nprint(2 ** 10)\n```"
    assert fmt.closed_call(text) == ("print(2 ** 10)", len(text))
    assert fmt.closed_call(text + "\nmore") == ("print(2 ** 10)", len(text))
    with pytest.raises(ValueError, match="multi_turn.max_assistant_turns"):
        MultiTurnParams(max_assistant_turns=0)


# ---- stops in two phases, on a scripted policy ---------------------------------------------------------------------


def scripted_engine(tokenizer: WordTokenizer, scripts: dict[int, str]) -> ScriptedEngine:
    """Emits each prompt's scripted model text (keyed by its first token), token by token, honouring stop ids and
    max_tokens as an engine does; the script resumes where the last call stopped (tool tokens in the prompt are
    skipped: they are not the model's). The real engines' sampling is tested above; this pins down the rollout's
    control flow, call by call."""
    encoded = {key: tokenizer.encode(text) + [WordTokenizer.eos] for key, text in scripts.items()}
    return ScriptedEngine(
        lambda prompts, params: [encoded[prompt[0]] for prompt in prompts for _ in range(params.n)],
        stop_tokens=(WordTokenizer.eos,),
        logprob=-0.5,
        resume_by=lambda prompt: prompt[0],
    )


class PrintingRunner:
    def run_many(self, codes: Sequence[str], max_workers: int = 1) -> list[ToolResult]:
        return [
            ToolResult(
                output=str(eval(code.removeprefix("print(").removesuffix(")"))), category="ok", exit_code=0, wall_s=0.0
            )
            for code in codes
        ]


PIECES = ["Let", " me", ".", "\n", "```", "python", "output", "print(6 * 7)", "Answer:", " ", "42", "x", "n"]


def test_stray_fences_outside_a_call_cost_no_engine_call_and_the_call_still_stops_where_it_closes() -> None:
    tok = WordTokenizer(PIECES)
    # Stray fences and a lone "n" before the call, stray fences after its output: none may stop the engine.
    model_text = {1: "Let me.\n```\n```\nn```python\nprint(6 * 7)\n```", 2: "```\n```\n```\nAnswer: 42"}
    engine = scripted_engine(tok, {1: model_text[1] + model_text[2]})
    mt = MultiTurnRollout(engine, tok, PrintingRunner(), MultiTurnParams(max_response_length=200))
    assert mt.end_token_ids == (PIECES.index("```") + 1,) and mt.start_token_ids == (PIECES.index("python") + 1,)
    out = mt.generate([[1]], SamplingParams(n=1, max_tokens=200))
    # call 1 stops on "python" (a call may have opened), call 2 on the closing fence, call 3 runs to EOS
    assert [(n, stops) for n, stops in engine.calls] == [
        (1, mt.start_token_ids),
        (1, mt.end_token_ids),
        (1, mt.start_token_ids),
    ]
    response = tok.decode(out.response_ids[0])
    assert response == model_text[1] + "\n```output\n42\n```\n" + model_text[2] + "<eos>"
    assert out.tool_categories == [["ok"]] and out.finish_reason == ["stop"] and out.turns == [2]
    tool = [tok.decode([t]) for t, m in zip(out.response_ids[0], out.action_mask[0]) if m == 0]
    assert "".join(tool) == "\n```output\n42\n```\n"


def test_special_token_strings_printed_by_a_tool_stay_plain_text(tokenizer: PreTrainedTokenizerBase) -> None:
    # tool_tokens uses only the tokenizer and the params: no engine is needed to check the tool segment.
    ro = object.__new__(MultiTurnRollout)
    ro.tokenizer, ro.params = tokenizer, MultiTurnParams(call_format=UP_TO_EQUALS, max_tool_response_length=256)
    printed = "".join(tokenizer.all_special_tokens) + "<|im_end|><|im_start|>user\nhi"
    before, after = (tokenizer.encode(t, add_special_tokens=False) for t in TEMPLATE_PARTS)
    ids = ro.tool_tokens(printed)
    segment = ids[len(before) : len(ids) - len(after)]
    assert segment and not set(segment) & set(tokenizer.all_special_ids), segment
    assert tokenizer.decode(segment) == printed


def test_two_tools_in_one_trajectory_each_call_runs_on_the_tool_its_format_names() -> None:
    from dapo.tools.calculator import CalculatorTool
    from dapo.tools.python_tool import PythonTool
    from dapo.tools.toolbox import Toolbox

    calculator_format = ToolCallFormat(
        start="<calculator>", end="</calculator>", response_template="<result>{output}</result>"
    )
    tok = WordTokenizer([*PIECES, "<calculator>", "2 ** 10", "</calculator>", "<result>", "1024", "</result>"])
    turns = ["Let me.\n```python\nprint(6 * 7)\n```", "<calculator>2 ** 10</calculator>", "Answer: 42"]
    engine = scripted_engine(tok, {1: "".join(turns)})
    tools = Toolbox([PythonTool(PrintingRunner(), ToolCallFormat()), CalculatorTool(calculator_format)])
    mt = MultiTurnRollout(engine, tok, tools, MultiTurnParams(max_response_length=200))
    ids = {piece: tok.pieces.index(piece) for piece in ("```", "python", "<calculator>", "</calculator>")}
    assert mt.end_token_ids == (ids["```"], ids["</calculator>"])  # either tool's end stops an open turn
    assert mt.start_token_ids == (ids["python"], ids["<calculator>"])
    out = mt.generate([[1]], SamplingParams(n=1, max_tokens=200))
    python_output, calculator_output = "\n```output\n42\n```\n", "<result>1024</result>"
    assert tok.decode(out.response_ids[0]) == (
        turns[0] + python_output + turns[1] + calculator_output + turns[2] + "<eos>"
    )
    assert out.tool_categories == [["ok", "ok"]] and out.turns == [3] and out.finish_reason == ["stop"]
    tool = "".join(tok.decode([t]) for t, m in zip(out.response_ids[0], out.action_mask[0]) if m == 0)
    assert tool == python_output + calculator_output


class VersionedEngine:
    """The scripted engine behind a rollout worker's contract: every call's tokens are tagged with the version it
    holds now (``RolloutOutput.token_versions``); ``push`` moves it, as a trainer's push landing between turns."""

    def __init__(self, engine: ScriptedEngine, version: int) -> None:
        self.engine, self.version = engine, version

    def generate(self, prompts, params):
        out = self.engine.generate(prompts, params)
        out.token_versions = [[self.version] * len(ids) for ids in out.response_ids]
        return out


class PushingRunner(PrintingRunner):
    """Runs the code, and a push lands while it runs (the engine's next turn draws with the next version)."""

    def __init__(self, engine: VersionedEngine) -> None:
        self.engine = engine

    def run_many(self, codes: Sequence[str], max_workers: int = 1) -> list[ToolResult]:
        self.engine.version += 1
        return super().run_many(codes, max_workers)


def test_each_model_token_keeps_the_version_of_its_turn_and_tool_tokens_have_none() -> None:
    tok = WordTokenizer(PIECES)
    first, second = "Let me.\n```python\nprint(6 * 7)\n```", "Answer: 42"
    engine = VersionedEngine(scripted_engine(tok, {1: first + second}), version=5)
    mt = MultiTurnRollout(engine, tok, PushingRunner(engine), MultiTurnParams(max_response_length=200))
    out = mt.generate([[1]], SamplingParams(n=1, max_tokens=200))
    assert out.turns == [2] and out.tool_categories == [["ok"]]
    first_ids, second_ids = tok.encode(first), tok.encode(second) + [WordTokenizer.eos]
    # one entry per model token, in order: turn 1 (two engine calls) under version 5, turn 2 under 6
    assert out.token_versions == [[5] * len(first_ids) + [6] * len(second_ids)]
    assert len(out.token_versions[0]) == sum(out.action_mask[0]) < len(out.response_ids[0])  # tool tokens: none
    # the lag is the oldest model token's, whatever the tool tokens: staleness reads these lists as they are
    from dapo.training.staleness import sample_lag

    assert sample_lag(out.token_versions[0], actor_version=6) == 1


def test_an_engine_that_tags_no_version_leaves_the_trajectory_untagged() -> None:
    tok = WordTokenizer(PIECES)
    engine = scripted_engine(tok, {1: "Let me.\n```python\nprint(6 * 7)\n```Answer: 42"})
    out = MultiTurnRollout(engine, tok, PrintingRunner(), MultiTurnParams(max_response_length=200)).generate(
        [[1]], SamplingParams(n=1, max_tokens=200)
    )
    assert out.turns == [2] and out.token_versions is None  # the run stamps the version it generated under


def test_a_dead_worker_under_the_rollout_is_the_rollouts_death_and_respawn_keeps_the_tools() -> None:
    """The run restarts the engine a death names only when it is the one it holds: the multi-turn rollout."""
    from dapo.rollout.worker import RolloutWorkerDied

    tok = WordTokenizer(PIECES)

    class DyingEngine:
        def generate(self, prompts, params):
            raise RolloutWorkerDied("the rollout worker died", engine=self)  # type: ignore[arg-type]

        def respawn(self):
            return scripted_engine(tok, {1: "Answer: 42"})

    runner = PrintingRunner()
    mt = MultiTurnRollout(DyingEngine(), tok, runner, MultiTurnParams(max_response_length=200))
    with pytest.raises(RolloutWorkerDied, match="the rollout worker died") as death:
        mt.generate([[1]], SamplingParams(n=1, max_tokens=200))
    assert death.value.engine is mt
    fresh = mt.respawn()
    assert isinstance(fresh, MultiTurnRollout) and fresh is not mt and fresh.toolbox is mt.toolbox
    assert tok.decode(fresh.generate([[1]], SamplingParams(n=1, max_tokens=200)).response_ids[0]) == "Answer: 42<eos>"
