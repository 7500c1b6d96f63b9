"""LoRA through the real CLI (verl's spelling): a run SIGKILLed after its step-2 checkpoint and resumed ends with
exactly the adapters of an uninterrupted run, and the checkpoint's adapter folder loads with plain PEFT and decodes
greedily what dapo's own LoRA policy decodes. All three runs are real processes forked from a warm server
(tests/harness/runners.py: the same command, without ~8 s of imports each)."""

from __future__ import annotations

import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from dapo.config import load_config
from dapo.infra.checkpoint import load_checkpoint
from dapo.model.loading import EMBEDDED_MODEL_DIR, load_policy
from dapo.model.lora import load_adapter_state, with_lora
from dapo.rollout.base import SamplingParams
from dapo.rollout.factory import EngineSpec, build_rollout_engine
from tests.harness.runners import kill_after_checkpoint, run_dapo_warm

LORA = ["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16", "actor.optim.lr=1e-3"]
STEPS = [
    "trainer.total_training_steps=4",
    "trainer.save_freq=2",
    "trainer.test_freq=0",
    "trainer.val_before_train=false",
]


def _adapter(run_dir, step: int = 4) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "checkpoints" / f"global_step_{step}" / "hf" / "adapter_model.safetensors")


def test_lora_resume_equals_uninterrupted_and_plain_peft_loads_it(tmp_path, fast_args) -> None:
    args = ["train", *fast_args, *LORA, *STEPS]
    straight = run_dapo_warm([*args, "trainer.experiment_name=straight"], tmp_path)
    assert straight.returncode == 0, straight.stderr[-3000:]

    # A second run of the same command, SIGKILLed (its whole process group) once its step-2 checkpoint is complete,
    # mid step 3, then resumed by the same command: LoRA's state (adapters, their AdamW moments) across a real kill.
    run_dir = tmp_path / "killed"
    kill_after_checkpoint(
        [*args, "trainer.experiment_name=killed"], run_dir / "checkpoints" / "global_step_2", tmp_path
    )
    resumed = run_dapo_warm([*args, "trainer.experiment_name=killed"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "done: 2 steps (resumed at step 2, now at step 4)" in resumed.stdout
    a, b = _adapter(tmp_path / "straight"), _adapter(run_dir)
    assert a.keys() == b.keys() and all(".lora_A." in k or ".lora_B." in k for k in a)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert any(not torch.equal(a[k], _adapter(run_dir, 2)[k]) for k in a), "steps 3-4 trained the adapters"

    # The adapter folder with plain PEFT, against dapo's LoRA policy restored from the same checkpoint.
    folder = run_dir / "checkpoints" / "global_step_4" / "hf"
    plain = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(EMBEDDED_MODEL_DIR), folder).eval()
    cfg = load_config(None, LORA)
    policy = with_lora(load_policy(cfg.model), cfg.model)
    load_checkpoint(
        folder.parent,
        model=policy.model,
        optimizer=None,
        scheduler=None,
        load_weights=lambda adapter: load_adapter_state(policy.model, adapter),
    )
    text = policy.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 3 + 4 * 2?"}], add_generation_prompt=True, tokenize=False
    )
    prompt = policy.tokenizer(text, add_special_tokens=False).input_ids
    ours = build_rollout_engine(EngineSpec(), policy).generate(
        [prompt], SamplingParams(n=1, temperature=0.0, max_tokens=24)
    )
    with torch.no_grad():
        theirs = plain.generate(
            input_ids=torch.tensor([prompt]),
            max_new_tokens=24,
            do_sample=False,
            eos_token_id=list(policy.eos_token_ids),
            pad_token_id=policy.pad_token_id,
        )
    theirs_ids = theirs[0, len(prompt) :].tolist()
    ours_ids = ours.response_ids[0]
    assert ours_ids and theirs_ids[: len(ours_ids)] == ours_ids
    assert policy.tokenizer.decode(ours_ids) == policy.tokenizer.decode(theirs_ids[: len(ours_ids)])

    # The merged model beside the adapter (hf/merged/) loads with plain transformers and decodes the same.
    merged = AutoModelForCausalLM.from_pretrained(folder / "merged").eval()
    with torch.no_grad():
        merged_ids = merged.generate(
            input_ids=torch.tensor([prompt]),
            max_new_tokens=24,
            do_sample=False,
            eos_token_id=list(policy.eos_token_ids),
            pad_token_id=policy.pad_token_id,
        )
    assert merged_ids[0, len(prompt) :].tolist()[: len(ours_ids)] == ours_ids
