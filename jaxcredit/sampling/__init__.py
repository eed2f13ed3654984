"""Generation with a KV cache, returning behaviour log-probs and entropies: static batches,
continuously refilled slots and trees; typed actions."""

from jaxcredit.sampling.actions import Actions, mask_logits, observed_inputs
from jaxcredit.sampling.continuous import generate_continuous
from jaxcredit.sampling.draw import inverse_cdf_sample, sample_token
from jaxcredit.sampling.contexts import (Contexts, Continuation, clear_contexts,
                                        continue_contexts, extend_contexts, start_contexts)
from jaxcredit.sampling.sampler import SampleOutput, generate, left_align, prompt_positions
from jaxcredit.sampling.tree import TreeSample, TreeSpec, sample_tree

__all__ = ["Actions", "Contexts", "Continuation", "SampleOutput", "clear_contexts",
           "continue_contexts", "extend_contexts", "generate", "generate_continuous",
           "inverse_cdf_sample", "left_align", "mask_logits", "observed_inputs",
           "prompt_positions", "sample_token", "sample_tree", "start_contexts", "TreeSample",
           "TreeSpec"]
