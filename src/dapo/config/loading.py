"""Building a DapoConfig at the edge: YAML files, dotted command-line overrides, verl key aliases, one validation.

verl's nested paths are accepted as aliases: ``actor_rollout_ref.actor.clip_ratio_high`` is ``actor.clip_ratio_high``
here, and the DAPO technique switches can also be reached under ``algorithm.*`` (``algorithm.clip_ratio_high``).
"""

from __future__ import annotations

import difflib
import types
import typing
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml
from pydantic import BaseModel, ValidationError

from dapo.config.schema import ConfigError, DapoConfig

# verl's nested paths -> ours, so a verl/DAPO recipe's overrides apply unchanged.
_PREFIX_ALIASES: dict[str, str] = {
    "actor_rollout_ref.actor.": "actor.",
    "actor_rollout_ref.rollout.": "rollout.",
    "actor_rollout_ref.model.": "model.",
}
# DAPO's technique switches, reachable where a reader of the paper looks for them.
_KEY_ALIASES: dict[str, str] = {
    "algorithm.clip_ratio_low": "actor.clip_ratio_low",
    "algorithm.clip_ratio_high": "actor.clip_ratio_high",
    "algorithm.clip_ratio_c": "actor.clip_ratio_c",
    "algorithm.loss_agg_mode": "actor.loss_agg_mode",
}


def canonical_key(dotted: str) -> str:
    """Map a verl-style or alias key to this tree's key."""
    for alias, target in _PREFIX_ALIASES.items():
        if dotted.startswith(alias):
            dotted = target + dotted[len(alias) :]
            break
    return _KEY_ALIASES.get(dotted, dotted)


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    # No leaf of the tree is a mapping, so every non-empty mapping is a section to descend into.
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def _section_type(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        for arg in typing.get_args(annotation):
            found = _section_type(arg)
            if found is not None:
                return found
    return None


def _check_known_key(dotted: str) -> None:
    """Reject an unknown dotted key with the allowed keys of its section and a close match."""
    parts = dotted.split(".")
    model: type[BaseModel] = DapoConfig
    for depth, part in enumerate(parts):
        allowed = list(model.model_fields)
        section = ".".join(parts[:depth])
        allowed += [a.rsplit(".", 1)[1] + f" (alias of {t})" for a, t in _KEY_ALIASES.items() if a.rsplit(".", 1)[0] == section]
        if part not in model.model_fields:
            where = ".".join(parts[:depth]) or "<top level>"
            close = difflib.get_close_matches(part, [a.split(" ")[0] for a in allowed], n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            if dotted == "actor.optim.lr_warmup_steps_ratio":
                hint = " Use actor.optim.lr_warmup_steps (an absolute number of optimizer steps)."
            raise ConfigError(f"unknown config key '{dotted}': section '{where}' has no '{part}'.{hint} "
                              f"Allowed keys there: {', '.join(allowed)}")
        sub = _section_type(model.model_fields[part].annotation)
        if sub is None:
            if depth != len(parts) - 1:
                raise ConfigError(f"config key '{dotted}': '{'.'.join(parts[: depth + 1])}' is a value, not a section")
            return
        model = sub


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    node = tree
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """Parse ``key.path=value``; the value is read as YAML (so 0.28, true, null, [a, b] work)."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' is not of the form key.path=value")
    key, raw = text.split("=", 1)
    key = key.strip().lstrip("+")  # hydra's '+key=value' means the same here
    if not key:
        raise ConfigError(f"override '{text}' has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override '{text}': cannot parse the value: {exc}") from None
    return key, value


def _format_validation_error(exc: ValidationError, origin: str) -> str:
    lines = [f"invalid configuration ({origin}):"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "<top level>"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        got = err.get("input")
        got_txt = "" if isinstance(got, dict) else f" (got {got!r})"
        lines.append(f"  {loc}: {msg}{got_txt}")
    return "\n".join(lines)


def build_config(tree: Mapping[str, Any] | None = None, overrides: Sequence[str] = (), *, origin: str = "config") -> DapoConfig:
    """Build and validate a config from a nested mapping plus dotted overrides."""
    flat: dict[str, Any] = {}
    for key, value in _flatten(tree or {}).items():
        canon = canonical_key(key)
        _check_known_key(canon)
        flat[canon] = value
    for text in overrides:
        key, value = parse_override(text)
        canon = canonical_key(key)
        _check_known_key(canon)
        flat[canon] = value
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        _set_dotted(nested, key, value)
    try:
        return DapoConfig.model_validate(nested)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, origin)) from None


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> DapoConfig:
    """Load a YAML config file (or the defaults when None) and apply dotted overrides."""
    tree: dict[str, Any] = {}
    origin = "defaults"
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            loaded = yaml.safe_load(p.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise ConfigError(f"{p}: not valid YAML: {exc}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of sections, got {type(loaded).__name__}")
        tree = loaded
        origin = str(p)
    if overrides:
        origin += " + overrides"
    return build_config(tree, overrides, origin=origin)


def config_to_dict(cfg: DapoConfig) -> dict[str, Any]:
    """A plain, YAML-safe dict of the whole tree (for run directories and trackers)."""
    return cfg.model_dump(mode="json")
