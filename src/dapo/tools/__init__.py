"""Tools a policy can call during a rollout: a sandboxed Python interpreter and the code-block format that calls it.

A layer beside data, reward and rollout: it imports nothing above ``core``/``infra`` and nothing of training, so a
rollout, an evaluation or a test can run hostile code through it without pulling in a model.
"""
