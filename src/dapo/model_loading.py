"""Load the policy model and its tokenizer: any Hugging Face causal LM by path, a GGUF file, or the embedded tiny Qwen2."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from dapo.config import ModelConfig

log = logging.getLogger(__name__)

EMBEDDED_MODEL_DIR = Path(__file__).resolve().parent / "assets" / "tiny-qwen2"


class ModelLoadError(RuntimeError):
    """The model or tokenizer cannot be used; the message says which path and why."""


@dataclass
class Policy:
    model: torch.nn.Module
    tokenizer: object
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    source: str


def resolve_model_path(cfg: ModelConfig) -> Path:
    path = Path(cfg.path).expanduser() if cfg.path else EMBEDDED_MODEL_DIR
    if not path.exists():
        what = "model.path" if cfg.path else "the embedded model (reinstall dapo)"
        raise ModelLoadError(f"{what}: '{path}' does not exist")
    if not path.is_dir():
        raise ModelLoadError(f"model.path: '{path}' is not a folder (for a GGUF file pass its folder as model.path "
                             f"and its name as model.gguf_file)")
    if cfg.gguf_file is not None and not (path / cfg.gguf_file).is_file():
        raise ModelLoadError(f"model.gguf_file: '{cfg.gguf_file}' not found in '{path}'")
    if cfg.gguf_file is None and not (path / "config.json").is_file():
        raise ModelLoadError(f"model.path: '{path}' has no config.json; is it a Hugging Face model folder? "
                             f"(for a GGUF file set model.gguf_file)")
    return path


def _eos_ids(model: torch.nn.Module, tokenizer) -> tuple[int, ...]:
    ids: list[int] = []
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    for value in (eos if isinstance(eos, (list, tuple)) else [eos]):
        if value is not None:
            ids.append(int(value))
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    # Chat models end a turn with an end-of-turn token that is not always the tokenizer's EOS.
    for special in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
        tid = tokenizer.convert_tokens_to_ids(special) if special in tokenizer.get_vocab() else None
        if tid is not None:
            ids.append(int(tid))
    return tuple(dict.fromkeys(ids))


def load_policy(cfg: ModelConfig, *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> Policy:
    """Load model + tokenizer, check the tokenizer has a chat template, and find EOS/pad ids."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(cfg)
    tok_path = Path(cfg.tokenizer_path).expanduser() if cfg.tokenizer_path else path
    kwargs: dict = {"trust_remote_code": cfg.trust_remote_code}
    if cfg.gguf_file is not None:
        kwargs["gguf_file"] = cfg.gguf_file
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(tok_path), **kwargs)
    except Exception as exc:  # transformers raises many types here; report them all the same way
        raise ModelLoadError(f"cannot load the tokenizer from '{tok_path}': {exc}") from exc
    if not getattr(tokenizer, "chat_template", None):
        raise ModelLoadError(
            f"the tokenizer at '{tok_path}' has no chat template; DAPO prompts are chat messages. Use an instruct "
            f"model, or add a chat_template to its tokenizer_config.json (model.tokenizer_path may point elsewhere)"
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, **kwargs)
    except Exception as exc:
        raise ModelLoadError(f"cannot load a causal LM from '{path}': {exc}") from exc
    model.to(device)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    eos_ids = _eos_ids(model, tokenizer)
    if not eos_ids:
        raise ModelLoadError(f"'{path}': neither the generation config nor the tokenizer names an EOS token")
    return Policy(model=model, tokenizer=tokenizer, eos_token_ids=eos_ids, pad_token_id=int(tokenizer.pad_token_id),
                  source=str(path) + (f" ({cfg.gguf_file})" if cfg.gguf_file else ""))
