"""Did-you-mean hints for a key given one section too high (``actor.lr`` is ``actor.optim.lr``)."""

import pytest

from dapo.config import ConfigError, load_config


@pytest.mark.parametrize(
    ("given", "meant"),
    [
        ("actor.lr", "actor.optim.lr"),
        ("actor.weight_decay", "actor.optim.weight_decay"),
        ("algorithm.max_num_gen_batches", "algorithm.filter_groups.max_num_gen_batches"),
    ],
)
def test_a_key_of_a_subsection_is_suggested(given: str, meant: str) -> None:
    with pytest.raises(ConfigError, match=f"unknown config key '{given}'.* Did you mean '{meant}'"):
        load_config(None, [f"{given}=1"])


def test_a_typo_still_gets_the_close_match_of_its_section() -> None:
    with pytest.raises(ConfigError, match="Did you mean 'clip_ratio_high'"):
        load_config(None, ["actor.clip_ratio_hgh=0.3"])
