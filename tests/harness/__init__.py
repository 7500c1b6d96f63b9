"""The tests' shared helpers, one per concept:

* :mod:`tests.harness.runners`: every way of running `dapo` (fresh subprocess, in-process, warm child, torchrun, warm
  torchrun agent), with a table of which to use when;
* :mod:`tests.harness.ports`: ``free_port`` and ``held_port`` on loopback;
* :mod:`tests.harness.models`: the tiny random-weight Qwen2 (``tiny_qwen2``) and the shapes the suites build it at;
* :mod:`tests.harness.tokenizers`: ``CharTokenizer``, where a character is a token;
* :mod:`tests.harness.engines`: ``ScriptedEngine``, a rollout engine that answers from a script.

Nothing is imported here: a test pays only for the modules it uses.
"""
