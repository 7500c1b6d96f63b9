"""Building a DapoConfig at the edge: YAML files, dotted command-line overrides, verl key aliases, one validation.

verl's nested paths are accepted as aliases: ``actor_rollout_ref.actor.clip_ratio_high`` is ``actor.clip_ratio_high``
here, and the DAPO technique switches can also be reached under ``algorithm.*`` (``algorithm.clip_ratio_high``).
"""

from __future__ import annotations

import difflib
import logging
import reprlib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml
from pydantic import BaseModel, ValidationError

from dapo.config import verl_keys
from dapo.config.async_notice import partial_rollout_notice
from dapo.config.objective import distillation_notice, objective_warnings, paper_defaults_notice
from dapo.config.schema import ConfigError, DapoConfig

log = logging.getLogger("dapo.config")

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


# Bounds on what a config may be, checked before anything walks or echoes it: a YAML alias chain ("billion
# laughs") of a few hundred bytes expands to millions of values, and a repr of it in an error message to gigabytes.
MAX_CONFIG_BYTES = 1 << 20  # a config file; dapo's own are a few KB
MAX_CONFIG_VALUES = 100_000  # values in the tree with every alias expanded; dapo's whole tree has a few hundred
MAX_CONFIG_DEPTH = 64  # nesting of the tree (dapo's is 4 deep)
MAX_ECHO_CHARS = 200  # of one value quoted in a message
MAX_PROBLEMS_SHOWN = 40  # lines of one ConfigError

_ECHO = reprlib.Repr()  # (keyword arguments only from Python 3.12)
_ECHO.maxlevel, _ECHO.maxstring, _ECHO.maxlong, _ECHO.maxother = 3, 120, 60, 120
_ECHO.maxtuple = _ECHO.maxlist = _ECHO.maxarray = _ECHO.maxdict = _ECHO.maxset = _ECHO.maxfrozenset = 8


def brief(value: Any) -> str:
    """``repr(value)`` bounded to ``MAX_ECHO_CHARS``, built without expanding the whole value (reprlib stops at
    a few items per level and a few levels), so a huge or self-referencing value costs nothing to quote."""
    text = _ECHO.repr(value)
    return text if len(text) <= MAX_ECHO_CHARS else text[: MAX_ECHO_CHARS - 3] + "..."


def config_tree_problem(tree: Any, where: str) -> str | None:
    """None, or why ``tree`` (a parsed YAML value) is refused: more than ``MAX_CONFIG_VALUES`` values once YAML
    aliases are expanded (counted with an early stop, so an alias bomb or a self-referencing alias costs at most
    that many steps), or nested deeper than ``MAX_CONFIG_DEPTH``."""
    count = 0
    stack: list[tuple[Any, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_CONFIG_VALUES:
            return (
                f"{where}: more than {MAX_CONFIG_VALUES:,} values once YAML aliases (*name) are expanded; a "
                "config has a few hundred. Refused before validation (an alias chain that multiplies "
                "a value, a 'billion laughs', would take gigabytes to expand)"
            )
        if depth > MAX_CONFIG_DEPTH:
            return f"{where}: nested more than {MAX_CONFIG_DEPTH} levels deep; a config is 4 levels deep"
        if isinstance(node, Mapping):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend((v, depth + 1) for v in node)
    return None


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


def named_section_type(annotation: Any) -> type[BaseModel] | None:
    """The section type of a ``dict[str, Section]`` field (sections the user names, e.g. the distillation
    teachers), else None."""
    if typing.get_origin(annotation) is dict:
        key_type, value_type = typing.get_args(annotation)
        if key_type is str and isinstance(value_type, type) and issubclass(value_type, BaseModel):
            return value_type
    return None


def _all_keys(model: type[BaseModel] = DapoConfig, prefix: str = "") -> list[str]:
    keys: list[str] = []
    for name, info in model.model_fields.items():
        sub = _section_type(info.annotation)
        named = named_section_type(info.annotation)
        if named is not None:
            keys += _all_keys(named, f"{prefix}{name}.<name>.")
            continue
        keys += _all_keys(sub, f"{prefix}{name}.") if sub is not None else [f"{prefix}{name}"]
    return keys


def _unknown_key_problem(dotted: str) -> str | None:
    """None for a key of this tree; else one line naming the key, its section's allowed keys and a close match."""
    parts = dotted.split(".")
    model: type[BaseModel] = DapoConfig
    named_next: type[BaseModel] | None = None
    for depth, part in enumerate(parts):
        if named_next is not None:  # a name the user chose (a teacher's): any name opens a section of that type
            if depth == len(parts) - 1:
                return f"config key '{dotted}' is a section, not a value"
            model, named_next = named_next, None
            continue
        allowed = list(model.model_fields)
        section = ".".join(parts[:depth])
        allowed += [
            a.rsplit(".", 1)[1] + f" (alias of {t})" for a, t in _KEY_ALIASES.items() if a.rsplit(".", 1)[0] == section
        ]
        if part not in model.model_fields:
            where = section or "<top level>"
            close = difflib.get_close_matches(part, [a.split(" ")[0] for a in allowed], n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            if not close:  # a key one section deeper (actor.lr is actor.optim.lr), of another section, or verl's
                deeper = [
                    k
                    for k in _all_keys()
                    if k.startswith(f"{section}.") and k.endswith(f".{part}") and depth == len(parts) - 1
                ]
                anywhere = (
                    deeper[:1]
                    if len(deeper) == 1
                    else difflib.get_close_matches(dotted, _all_keys() + _verl_spellings(), n=1, cutoff=0.75)
                )
                hint = f" Did you mean '{anywhere[0]}'?" if anywhere else ""
            if dotted == "actor.optim.lr_warmup_steps_ratio":
                hint = " Use actor.optim.lr_warmup_steps (an absolute number of optimizer steps)."
            return (
                f"unknown config key '{dotted}': section '{where}' has no '{part}'.{hint} "
                f"Allowed keys there: {', '.join(allowed)}"
            )
        named_next = named_section_type(model.model_fields[part].annotation)
        if named_next is not None:
            if depth == len(parts) - 1:
                return f"config key '{dotted}' is a section of named entries ('{dotted}.<name>.*'), not a value"
            continue
        sub = _section_type(model.model_fields[part].annotation)
        if sub is None:
            if depth != len(parts) - 1:
                return f"config key '{dotted}': '{'.'.join(parts[: depth + 1])}' is a value, not a section"
            return None
        model = sub
    return f"config key '{dotted}' is a section, not a value"


def _verl_spellings() -> list[str]:
    return [
        e.key.rstrip(".")
        for table in (verl_keys.RENAMED, verl_keys.EXPANDED, verl_keys.FIXED, verl_keys.MATCHES)
        for e in table
    ]


def _check_known_key(dotted: str) -> None:
    """Reject an unknown dotted key with the allowed keys of its section and a close match."""
    problem = _unknown_key_problem(dotted)
    if problem is not None:
        raise ConfigError(problem)


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
        raise ConfigError(f"override {brief(text)} is not of the form key.path=value")
    key, raw = text.split("=", 1)
    key = key.strip().lstrip("+")  # hydra's '+key=value' means the same here
    if not key:
        raise ConfigError(f"override {brief(text)} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override '{brief(text)}': cannot parse the value: {exc}") from None
    problem = config_tree_problem(value, f"override {key}")
    if problem is not None:
        raise ConfigError(problem)
    return key, value


def _validation_problems(exc: ValidationError) -> list[str]:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "<top level>"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        got = err.get("input")
        got_txt = "" if isinstance(got, dict) else f" (got {brief(got)})"
        hint = ""
        if err["type"] == "literal_error" and isinstance(got, str):
            choices = [
                c.strip().strip("'")
                for c in str(err.get("ctx", {}).get("expected", "")).replace(" or ", ",").split(",")
            ]
            close = difflib.get_close_matches(got, [c for c in choices if c], n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
        lines.append(f"{loc}: {msg}{got_txt}{hint}")
    return lines


def _format_validation_error(exc: ValidationError, origin: str) -> str:
    return "\n".join([f"invalid configuration ({origin}):", *(f"  {line}" for line in _validation_problems(exc))])


def _same_value(a: Any, b: Any) -> bool:
    return (
        type(a) is type(b)
        and a == b
        or (isinstance(a, float) and isinstance(b, int) and not isinstance(b, bool) and a == b)
    )


@dataclass
class ConfigReport:
    """What building a config did besides validating it: one line per verl key accepted without effect or objective
    setting that does not do what the paper or verl does (warnings), and per default taken from the loss mode's
    paper instead of DAPO's (notices)."""

    warnings: list[str] = field(default_factory=list)
    renamed: dict[str, str] = field(default_factory=dict)  # verl key as given -> our key
    notices: list[str] = field(default_factory=list)


def _entries(tree: Mapping[str, Any] | None, overrides: Sequence[str], problems: list[str]) -> list[tuple[str, Any]]:
    entries = list(_flatten(tree or {}).items())
    for text in overrides:
        try:
            entries.append(parse_override(text))
        except ConfigError as exc:
            problems.append(str(exc))
    return entries


def build_config_with_report(
    tree: Mapping[str, Any] | None = None, overrides: Sequence[str] = (), *, origin: str = "config"
) -> tuple[DapoConfig, ConfigReport]:
    """Build and validate a config from a nested mapping plus dotted overrides; every problem in one ConfigError.

    verl keys are mapped as ``dapo.config.verl_keys`` says: renamed (value translated), fixed (accepted when the
    value is the one behaviour here), or accepted with a warning in the report saying why they do not apply.
    """
    problem = config_tree_problem(tree or {}, origin)
    if problem is not None:
        raise ConfigError(problem)
    report = ConfigReport()
    problems: list[str] = []
    warned: dict[str, list[str]] = {}
    matches: list[tuple[str, Any, verl_keys.Matches]] = []
    flat: dict[str, Any] = {}
    for given, value in _entries(tree, overrides, problems):
        key = canonical_key(given)
        entry = verl_keys.lookup(key)
        if isinstance(entry, verl_keys.Renamed):
            target = entry.target + key[len(entry.key) :] if entry.key.endswith(".") else entry.target
            value = entry.translate(value) if entry.translate else value
            report.renamed[given] = target
            if value is None and target == "actor.ppo_micro_batch_size_per_gpu":
                continue  # verl's null: not set
            key = target
        elif isinstance(entry, verl_keys.Expanded):
            try:
                targets = entry.expand(value)
            except ValueError as exc:
                problems.append(f"{given}={value!r}: {exc} ({entry.why})")
                continue
            report.renamed[given] = ", ".join(targets)
            flat.update(targets)
            continue
        elif isinstance(entry, verl_keys.Fixed):
            if not any(_same_value(value, a) for a in entry.allowed):
                allowed = " or ".join(repr(a) for a in entry.allowed)
                problems.append(f"{given}={brief(value)}: only {allowed} is supported here: {entry.why}")
            continue
        elif isinstance(entry, verl_keys.Matches):
            matches.append((given, value, entry))
            continue
        elif isinstance(entry, verl_keys.Warned):
            warned.setdefault(entry.why, [])
            if given not in warned[entry.why]:
                warned[entry.why].append(given)
            continue
        translation = verl_keys.value_translation(key)
        if translation is not None:
            value = translation.translate(value)
        problem = _unknown_key_problem(key)
        if problem is not None:
            problems.append(problem if key == given else problem.replace(f"'{key}'", f"'{given}' (= '{key}')", 1))
            continue
        flat[key] = value
    # verl: with no total_training_steps, total_epochs passes over the data set decide the length of the run.
    if "trainer.total_epochs" in flat and "trainer.total_training_steps" not in flat:
        flat["trainer.total_training_steps"] = None
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        _set_dotted(nested, key, value)
    cfg = None
    try:
        cfg = DapoConfig.model_validate(nested)
    except ValidationError as exc:
        problems.extend(_validation_problems(exc))
    if cfg is not None:
        for given, value, entry in matches:
            ours = _get_dotted(cfg, entry.other)
            if not _same_value(value, ours):
                problems.append(f"{given}={brief(value)} differs from {entry.other}={brief(ours)}: {entry.why}")
        run_dir = Path(cfg.trainer.default_local_dir)
        if run_dir.name == cfg.trainer.experiment_name:
            report.warnings.append(
                f"trainer.default_local_dir={cfg.trainer.default_local_dir}: the run directory here is "
                f"default_local_dir/experiment_name = {run_dir / cfg.trainer.experiment_name} (verl writes "
                "checkpoints into default_local_dir itself); pass its parent to get verl's layout"
            )
    if problems:
        head = f"invalid configuration ({origin}): {len(problems)} problem{'s' if len(problems) > 1 else ''}"
        shown = [f"  {p}" for p in problems[:MAX_PROBLEMS_SHOWN]]
        if len(problems) > MAX_PROBLEMS_SHOWN:
            shown.append(f"  ... and {len(problems) - MAX_PROBLEMS_SHOWN} more")
        raise ConfigError("\n".join([head, *shown]))
    for why, keys in warned.items():
        report.warnings.append(f"{', '.join(keys)}: accepted without effect: {why}")
    assert cfg is not None
    report.warnings.extend(objective_warnings(cfg))
    for notice in (paper_defaults_notice(cfg), distillation_notice(cfg), partial_rollout_notice(cfg)):
        if notice is not None:
            report.notices.append(notice)
    return cfg, report


def build_config(
    tree: Mapping[str, Any] | None = None, overrides: Sequence[str] = (), *, origin: str = "config"
) -> DapoConfig:
    """Build and validate a config from a nested mapping plus dotted overrides (warnings go to the log)."""
    cfg, report = build_config_with_report(tree, overrides, origin=origin)
    log_report(report)
    return cfg


def log_report(report: ConfigReport) -> None:
    """The report's warnings at WARNING, its notices at INFO (logger ``dapo.config``)."""
    for line in report.warnings:
        log.warning("%s", line)
    for line in report.notices:
        log.info("%s", line)


def _get_dotted(cfg: BaseModel, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def read_config_yaml(p: Path) -> Any:
    """The parsed YAML of config file ``p``, refused with a ``ConfigError`` that says why when it is missing, larger than
    ``MAX_CONFIG_BYTES``, binary, not UTF-8 or not valid YAML."""
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        size = p.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"{p}: {size:,} bytes; config files over {MAX_CONFIG_BYTES:,} bytes are refused (a "
                "config is a few KB: is this the right file?)"
            )
        data = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read it: {exc.strerror or exc}") from None
    nul = data.find(b"\0")
    if nul >= 0:
        raise ConfigError(
            f"{p}: a binary file (a NUL byte at offset {nul}), not a YAML config: is this the right file?"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{p}: not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x}): a config file is YAML in UTF-8"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from None


def merge_config_trees(base: Mapping[str, Any], later: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``later`` laid over it: mappings merge key by key (recursively), anything else in ``later``
    (a scalar, a list) replaces ``base``'s value. How several ``--config`` files combine, in order."""
    merged = dict(base)
    for key, value in later.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_config_trees(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_config_with_report(
    path: str | Path | Sequence[str | Path] | None = None, overrides: Sequence[str] = ()
) -> tuple[DapoConfig, ConfigReport]:
    """``load_config`` that also returns the report (the verl keys accepted without effect, and why)."""
    paths = [] if path is None else [path] if isinstance(path, (str, Path)) else list(path)
    tree: dict[str, Any] = {}
    for p in map(Path, paths):
        loaded = read_config_yaml(p)
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of sections, got {type(loaded).__name__}")
        tree = merge_config_trees(tree, loaded)
    origin = " + ".join(str(p) for p in paths) if paths else "defaults"
    if overrides:
        origin += " + overrides"
    return build_config_with_report(tree, overrides, origin=origin)


def load_config(path: str | Path | Sequence[str | Path] | None = None, overrides: Sequence[str] = ()) -> DapoConfig:
    """Load a YAML config file (or several, merged in order: later files override earlier ones key by key; or the
    defaults when None) and apply dotted overrides.

    Every unknown or invalid key is reported in one ``ConfigError``; verl keys accepted without effect are logged
    as one warning line each (logger ``dapo.config``).
    """
    cfg, report = load_config_with_report(path, overrides)
    log_report(report)
    return cfg


def tracker_backends(cfg: DapoConfig) -> list[str]:
    """The metric sinks of a run: ``trainer.logger`` with ``jsonl`` always first, because ``metrics.jsonl`` is the
    run record (plots, resume truncation and the end-of-run summary read it), not a choice of dashboard."""
    return ["jsonl", *[b for b in cfg.trainer.logger if b != "jsonl"]]


def config_to_dict(cfg: DapoConfig) -> dict[str, Any]:
    """A plain, YAML-safe dict of the whole tree (for run directories and trackers)."""
    return cfg.model_dump(mode="json")
