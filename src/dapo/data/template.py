"""The DAPO prompt template (the one DAPO-Math-17k and the AIME 2024 validation file use)."""

DAPO_PROMPT_TEMPLATE = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
    "{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)


def apply_dapo_template(problem: str) -> str:
    """Wrap a raw problem statement in the DAPO prompt template."""
    return DAPO_PROMPT_TEMPLATE.format(problem=problem.strip())
