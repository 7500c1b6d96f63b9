"""Load a user reward function from a .py file, as verl's ``custom_reward_function`` does.

The spec is ``"path/to/file.py:function_name"``; the function is called with keywords, as verl calls
it, ``fn(data_source=..., solution_str=..., ground_truth=..., extra_info=...)``, and returns a float or a
dict with ``"score"`` (see ``dapo.reward.result.as_reward_result``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

CustomRewardFn = Callable[[str, str, str, dict | None], Any]


def parse_custom_fn_spec(spec: str) -> tuple[Path, str]:
    """Split ``"path/to/file.py:function_name"`` into its path and function name."""
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"custom reward function spec must look like 'path/to/file.py:function_name', got {spec!r}")
    path, name = spec.rsplit(":", 1)
    if not path or not name.isidentifier():
        raise ValueError(
            f"custom reward function spec {spec!r}: need a file path and a Python identifier after the last ':'"
        )
    return Path(path), name


def load_custom_reward_fn(spec: str) -> CustomRewardFn:
    """Import the file named in ``spec`` and return its function; clear errors for each way it can fail."""
    path, name = parse_custom_fn_spec(spec)
    path = path.expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"custom reward function file not found: {path} (from spec {spec!r})")
    # A name unique to the file, so two files with the same stem do not shadow each other in sys.modules.
    module_name = f"dapo_custom_reward_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:10]}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"cannot import {path} as a Python module (from spec {spec!r})")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[module_name]
        raise ImportError(f"importing custom reward function file {path} failed: {type(e).__name__}: {e}") from e
    if not hasattr(module, name):
        available = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise AttributeError(f"{path} has no function {name!r}; callables defined there: {available}")
    fn = getattr(module, name)
    if not callable(fn):
        raise TypeError(f"{path}:{name} is a {type(fn).__name__}, not a function")
    _check_signature(fn, f"{path}:{name}")
    return fn


def _check_signature(fn: Callable[..., Any], where: str) -> None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # some builtins have no introspectable signature; let the first call decide
    try:
        signature.bind(data_source="", solution_str="", ground_truth="", extra_info=None)
    except TypeError as e:
        raise TypeError(
            f"{where}{signature} cannot be called as fn(data_source=, solution_str=, ground_truth=, extra_info=): {e}"
        ) from None
