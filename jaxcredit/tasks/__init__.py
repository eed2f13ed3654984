"""Tasks with verifiable rewards, their tokenizers and data."""

from jaxcredit.tasks import chat_template
from jaxcredit.tasks.tokenizers import CharTokenizer, HFTokenizer, Tokenizer

__all__ = ["CharTokenizer", "HFTokenizer", "Tokenizer", "chat_template"]
