"""zipf_explain, in one package: its rules and grammar (`definition`), its Rao-Blackwellised
Monte-Carlo oracle (`oracle`) and its traceable form for the batched lab (`traceable`); it
runs in the batched lab only. The definition's names are the package's.
"""

from jaxcredit.tasks import task
from jaxcredit.tasks.zipf_explain import definition, oracle, traceable
from jaxcredit.tasks.zipf_explain.definition import (BOS, EOS, KEY0, MARK, MAX_KEYS, MAX_WORDS, PAD,
                                                     SEP, VOCAB_SIZE, WORD0, ZipfExplainConfig,
                                                     allowed, allowed_in_rows, demonstrations,
                                                     grammar, make_example, outcome, prompts,
                                                     reward, token_names)

__all__ = ["BOS", "EOS", "KEY0", "MARK", "MAX_KEYS", "MAX_WORDS", "PAD", "SEP", "TASK",
           "VOCAB_SIZE", "WORD0", "ZipfExplainConfig", "allowed", "allowed_in_rows", "definition",
           "demonstrations", "grammar", "make_example", "oracle", "outcome", "prompts", "reward",
           "token_names", "traceable"]

TASK = task.register(task.Task(name="zipf_explain", options=ZipfExplainConfig,
                               traceable=traceable.Traceable))
