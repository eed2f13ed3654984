"""Generation with a KV cache, returning behaviour log-probs and entropies."""

from jaxcredit.sampling.sampler import SampleOutput, generate, left_align, prompt_positions, sample_token

__all__ = ["SampleOutput", "generate", "left_align", "prompt_positions", "sample_token"]
