"""``trainer.rollout_data_dir`` (verl's key): every step's training batch written as ``<step>.jsonl``, one line per
sample, so that what the update actually saw can be read back (which groups Eq. 11 let through, which weights drew
each token) without a debugger.

A line holds verl's fields (``input``, ``output``, ``gts``, ``score``, ``step``) plus ``group`` (the group's place in
the batch), ``uid`` (its prompt), ``acc`` (the raw accuracy Eq. 11 decides on) and, for a batch an older engine
produced (asynchronous training), ``weight_versions`` (the version of each response token) and ``lag`` (versions
between the actor that trains on it and its oldest token). The file of a step is replaced as a whole, so a step that
a resumed run trains again leaves one file, that of the step as trained.
"""

from __future__ import annotations

import json
from pathlib import Path

from dapo.infra.atomic import atomic_write
from dapo.reward.scored_groups import ScoredGroup
from dapo.training.staleness import sample_lag


def dump_batch(
    directory: str | Path, step: int, groups: list[ScoredGroup], tokenizer, *, with_versions: bool = False
) -> Path:
    """Write ``directory/<step>.jsonl`` for the ``groups`` step ``step`` trains on; ``with_versions``: they came in
    from an older engine, and each line says which weights drew its tokens (the actor that trains on them holds
    version step-1). An empty batch (an update skipped) writes an empty file: the step ran and trained nothing."""
    lines = []
    for g, group in enumerate(groups):
        prompt = tokenizer.decode(list(group.prompt.input_ids), skip_special_tokens=True)
        for s, response in enumerate(group.response_ids):
            line = {
                "input": prompt,
                "output": tokenizer.decode(response, skip_special_tokens=True),
                "gts": group.prompt.ground_truth,
                "score": group.scores[s],
                "step": step,
                "group": g,
                "uid": group.prompt.uid,
                "acc": bool(group.acc[s]),
            }
            if with_versions:
                versions = group.token_versions[s] if group.token_versions is not None else []
                line["weight_versions"] = versions
                line["lag"] = sample_lag(versions, actor_version=step - 1)
            lines.append(json.dumps(line, ensure_ascii=False) + "\n")
    return atomic_write(Path(directory) / f"{step}.jsonl", "".join(lines))
