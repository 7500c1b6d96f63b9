"""On-policy distillation (docs/distillation.md): a teacher scores the student's own samples.

``teacher`` (what every teacher answers and the guards on its answers), ``vocabulary`` (the same-tokenizer check),
``local_teacher`` (a Hugging Face folder, forward only, in the trainer), ``served_teacher`` (an OpenAI-compatible
server's prompt log-probs), ``teachers`` (the configured set, routing samples by ``distillation.teacher_key``) and
``signal`` (the teacher's log-probs turned into the batch's per-token advantages or loss inputs, with metrics).
"""
