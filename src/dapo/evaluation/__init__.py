"""Evaluating a policy: validation metrics (mean@k, pass@k) over held-out prompts."""
