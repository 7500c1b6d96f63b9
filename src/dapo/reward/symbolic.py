"""Symbolic answer equivalence with ``math-verify``, under a hard per-sample time limit.

``math-verify`` (optional: ``pip install 'dapo[verify]'``) parses LaTeX into SymPy and compares values,
so ``\\frac{\\sqrt2}{2}`` equals ``\\frac{1}{\\sqrt{2}}`` and ``[2,5)`` equals ``[2, 5)``. SymPy can run
for a very long time on hostile input (``e^{e^{e^{e^e}}}``). math-verify's own limit is a SIGALRM per
parse and per comparison: it works only in the main thread, a response can spend it several times
over (two parses, then up to four comparisons), and it is only checked between Python bytecodes.

So the work runs in a child process (spawned, so it is safe beside torch threads). The parent waits at
most ``timeout_s`` for each answer; a child that has not answered by then is SIGKILLed, the sample is
judged not equivalent, and a fresh child is spawned on the next call. math-verify's own alarm is kept
inside the child (whole seconds, about a third of ``timeout_s``), so most slow cases end there without
the cost of a respawn.
"""

from __future__ import annotations

import importlib.util
import math
import os
import threading
from multiprocessing.connection import Connection
from typing import Any

from dapo.reward.child_process import SPAWN, die_with_parent, kill_and_reap

INSTALL_HINT = "install it with: pip install 'dapo[verify]'  (or: pip install math-verify)"


def math_verify_available() -> bool:
    """Whether the optional ``math-verify`` package can be imported."""
    return importlib.util.find_spec("math_verify") is not None


def as_inline_math(answer: str) -> str:
    """``answer`` as one ``$...$`` formula, for math-verify's LaTeX extractor (stray ``$`` dropped)."""
    return "$" + answer.replace("$", "").strip() + "$"


class SymbolicVerifier:
    """Decides whether two final answers are mathematically equal, in a killable child process.

    ``equivalent`` never raises for any answer text and returns within about ``timeout_s`` once the child
    is running (starting it takes up to ``start_timeout_s`` more, once). Thread-safe (calls are
    serialised). Pickling keeps only the settings: each process that unpickles one starts its own child.
    """

    def __init__(self, timeout_s: float = 5.0, *, start_timeout_s: float = 60.0) -> None:
        if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"SymbolicVerifier timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if not (isinstance(start_timeout_s, (int, float)) and start_timeout_s > 0):
            raise ValueError(f"SymbolicVerifier start_timeout_s must be positive, got {start_timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        self._restarts = 0
        self._process: Any = None
        self._conn: Connection | None = None
        self._lock = threading.Lock()

    @property
    def restarts(self) -> int:
        """How many times a child was killed (timed out) or found dead and had to be replaced."""
        return self._restarts

    @property
    def running(self) -> bool:
        """Whether a child process is currently alive."""
        return self._process is not None and self._process.is_alive()

    @property
    def inner_timeout_s(self) -> int:
        """math-verify's own per-step alarm inside the child, in whole seconds."""
        return max(1, int(self.timeout_s / 3))

    def equivalent(self, prediction: str, ground_truth: str) -> bool:
        """True iff math-verify proves ``prediction`` equal to ``ground_truth`` within the time limit."""
        with self._lock:
            conn = self._running_child()
            if conn is None:
                return False
            try:
                conn.send((prediction, ground_truth))
                if conn.poll(self.timeout_s):
                    kind, value = conn.recv()
                    return kind == "result" and value is True
            except (EOFError, OSError):
                pass  # the child died (e.g. out of memory): replace it below
            self._replace_child()
            return False

    def start(self) -> None:
        """Start the child now (otherwise the first ``equivalent`` call does), so no sample waits for it."""
        with self._lock:
            self._running_child()

    def close(self) -> None:
        """Stop the child process, if any. The verifier stays usable: the next call starts a new child."""
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.send(None)
                except OSError:
                    pass
                self._conn.close()
            if self._process is not None:
                self._process.join(timeout=1)
                kill_and_reap(self._process)
            self._process, self._conn = None, None

    def __enter__(self) -> SymbolicVerifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            kill_and_reap(self._process)
        except Exception:
            pass

    def __getstate__(self) -> dict[str, float]:
        return {"timeout_s": self.timeout_s, "start_timeout_s": self.start_timeout_s}

    def __setstate__(self, state: dict[str, float]) -> None:
        self.__init__(state["timeout_s"], start_timeout_s=state["start_timeout_s"])  # type: ignore[misc]

    def _replace_child(self) -> None:
        kill_and_reap(self._process)
        if self._conn is not None:
            self._conn.close()
        self._process, self._conn = None, None
        self._restarts += 1

    def _running_child(self) -> Connection | None:
        if self._process is not None and self._process.is_alive():
            return self._conn
        if self._process is not None:
            self._replace_child()
        if not math_verify_available():
            raise ImportError(f"the symbolic reward backend needs the 'math-verify' package; {INSTALL_HINT}")
        parent_conn, child_conn = SPAWN.Pipe()
        process = SPAWN.Process(
            target=_child_main,
            args=(child_conn, os.getpid(), self.inner_timeout_s),
            name="dapo-symbolic-verifier",
            daemon=True,
        )
        process.start()
        child_conn.close()
        self._process, self._conn = process, parent_conn
        try:
            if parent_conn.poll(self.start_timeout_s):
                kind, value = parent_conn.recv()
                if kind == "ready":
                    return parent_conn
                self._replace_child()
                raise ImportError(f"math-verify failed to load in the verifier process: {value}; {INSTALL_HINT}")
        except (EOFError, OSError):
            pass
        self._replace_child()  # did not come up in time (an overloaded machine): this sample is judged wrong
        return None


def _child_main(conn: Connection, parent_pid: int, inner_timeout_s: int) -> None:
    """The child process: answer ``(prediction, ground_truth)`` requests until ``None`` or EOF."""
    die_with_parent(parent_pid)
    try:
        import logging

        logging.disable(logging.CRITICAL)  # math-verify logs the whole input on each timeout
        from math_verify import parse, verify
    except Exception as e:  # report instead of dying silently
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        if request is None:
            return
        prediction, ground_truth = request
        try:
            gold = parse(as_inline_math(ground_truth), parsing_timeout=inner_timeout_s)
            target = parse(as_inline_math(prediction), parsing_timeout=inner_timeout_s)
            same = bool(gold) and bool(target) and verify(gold, target, timeout_seconds=inner_timeout_s)
        except BaseException:  # math-verify's TimeoutException derives from BaseException
            same = False
        conn.send(("result", bool(same)))
