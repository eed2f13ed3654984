"""key_token, in one package: its rules, data and training form (`definition`), its exact
oracle (`oracle`: E-DEC and E-TREE) and its traceable form for the batched lab
(`traceable`). The definition's names are the package's.
"""

from jaxcredit.tasks import task
from jaxcredit.tasks.key_token import definition, oracle, traceable
from jaxcredit.tasks.key_token.definition import (BOS, EOS, FILL, FILLER0, KEY0, PAD, PLACEMENTS,
                                                  RULES, SEP, VOCAB_SIZE, KeyToken, KeyTokenConfig,
                                                  allowed, allowed_in_rows, explain, make_example,
                                                  noisy, observe, reward, row_actions, rule_reward,
                                                  token_names, train_task)

__all__ = ["BOS", "EOS", "FILL", "FILLER0", "KEY0", "PAD", "PLACEMENTS", "RULES", "SEP", "TASK",
           "VOCAB_SIZE", "KeyToken", "KeyTokenConfig", "allowed", "allowed_in_rows", "definition",
           "explain", "make_example", "noisy", "observe", "oracle", "reward", "row_actions",
           "rule_reward", "token_names", "traceable", "train_task"]

TASK = task.register(task.Task(name="key_token", options=KeyTokenConfig, data=KeyToken,
                               train=train_task, traceable=traceable.Traceable, oracle=oracle))
