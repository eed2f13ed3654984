"""key_turns, in one package: its rules, environment, data and training form (`definition`)
and its exact turn-level oracle (`oracle`). The definition's names are the package's.
"""

from jaxcredit.tasks import task
from jaxcredit.tasks.key_turns import definition, oracle
from jaxcredit.tasks.key_turns.definition import (MAX_TURNS, VOCAB_SIZE, KeyTurns,
                                                  KeyTurnsConfig, KeyTurnsEnv, decisive_turns,
                                                  demonstration_actions, episode_source,
                                                  make_example, sample_episodes, token_names,
                                                  train_task)

__all__ = ["MAX_TURNS", "TASK", "VOCAB_SIZE", "KeyTurns", "KeyTurnsConfig", "KeyTurnsEnv",
           "decisive_turns", "definition", "demonstration_actions", "episode_source",
           "make_example", "oracle", "sample_episodes", "token_names", "train_task"]

TASK = task.register(task.Task(name="key_turns", options=KeyTurnsConfig, data=KeyTurns,
                               train=train_task, oracle=oracle))
