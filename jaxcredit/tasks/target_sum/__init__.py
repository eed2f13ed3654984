"""target_sum, in one package: its rules, data and training form (`definition`), its exact
oracle (`oracle`: E-TREE) and its traceable form for the batched lab (`traceable`). The
definition's names are the package's.
"""

from jaxcredit.tasks import task
from jaxcredit.tasks.target_sum import definition, oracle, traceable
from jaxcredit.tasks.target_sum.definition import (BOS, DIGIT0, EOS, PAD, PROMPT_LENGTH, SEP,
                                                   VOCAB_SIZE, TargetSum, TargetSumConfig, allowed,
                                                   allowed_in_rows, make_example, outcome, prompts,
                                                   reward, token_names, train_task)

__all__ = ["BOS", "DIGIT0", "EOS", "PAD", "PROMPT_LENGTH", "SEP", "TASK", "VOCAB_SIZE", "TargetSum",
           "TargetSumConfig", "allowed", "allowed_in_rows", "definition", "make_example", "oracle",
           "outcome", "prompts", "reward", "token_names", "traceable", "train_task"]

TASK = task.register(task.Task(name="target_sum", options=TargetSumConfig, data=TargetSum,
                               train=train_task, traceable=traceable.Traceable, oracle=oracle))
