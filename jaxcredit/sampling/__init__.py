"""Generation with a KV cache, returning behaviour log-probs and entropies; typed actions."""

from jaxcredit.sampling.actions import Actions, mask_logits, observed_inputs
from jaxcredit.sampling.draw import inverse_cdf_sample, sample_token
from jaxcredit.sampling.sampler import (Contexts, Continuation, SampleOutput, continue_contexts,
                                       extend_contexts, generate, left_align, prompt_positions,
                                       start_contexts)

__all__ = ["Actions", "Contexts", "Continuation", "SampleOutput", "continue_contexts",
           "extend_contexts", "generate", "inverse_cdf_sample", "left_align", "mask_logits",
           "observed_inputs", "prompt_positions", "sample_token", "start_contexts"]
