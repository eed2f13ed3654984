"""Character and Hugging Face tokenizers share one interface."""

import numpy as np
import pytest

from jaxcredit.tasks import CharTokenizer, HFTokenizer


def test_char_tokenizer_round_trip_and_batches():
  tok = CharTokenizer("0123456789+=")
  assert tok.vocab_size == 15
  ids = tok.encode("12+3=", add_bos=True, add_eos=True)
  assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
  assert tok.decode(ids) == "12+3="
  assert tok.decode(ids, skip_special=False) == "<bos>12+3=<eos>"
  batch, valid = tok.encode_batch(["1+1=", "12+34="], length=6)
  np.testing.assert_array_equal(valid, [[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
  assert tok.decode(batch[0]) == "1+1="
  right, right_valid = tok.encode_batch(["1+1="], length=6, padding="right")
  np.testing.assert_array_equal(right_valid, [[1, 1, 1, 1, 0, 0]])
  kept, _ = tok.encode_batch(["123456789"], length=4, truncation="left")
  assert tok.decode(kept[0]) == "6789"


def test_char_tokenizer_errors():
  tok = CharTokenizer("ab")
  with pytest.raises(ValueError, match=r"Characters \['c'\] are not in the alphabet"):
    tok.encode("abc")
  with pytest.raises(ValueError, match="Text 1 has 5 tokens, more than length=4"):
    tok.encode_batch(["ab", "ababa"], length=4)
  with pytest.raises(ValueError, match="outside the vocabulary"):
    tok.decode([9])
  with pytest.raises(ValueError, match="repeats characters"):
    CharTokenizer("aa")


def test_hf_tokenizer_from_tokenizer_json(tmp_path):
  tokenizers = pytest.importorskip("tokenizers")
  vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4, "[UNK]": 5}
  model = tokenizers.models.WordLevel(vocab, unk_token="[UNK]")
  raw = tokenizers.Tokenizer(model)
  raw.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  raw.add_special_tokens(["<pad>", "<s>", "</s>"])
  raw.save(str(tmp_path / "tokenizer.json"))
  tok = HFTokenizer(tmp_path, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
  assert tok.vocab_size == 6
  ids = tok.encode("hello world", add_eos=True)
  assert ids == [3, 4, 2]
  assert tok.decode(ids) == "hello world"
  batch, valid = tok.encode_batch(["hello", "hello world"], length=3, add_bos=True)
  np.testing.assert_array_equal(batch, [[0, 1, 3], [1, 3, 4]])
  np.testing.assert_array_equal(valid, [[0, 1, 1], [1, 1, 1]])
  with pytest.raises(
    ValueError, match="Special token '<mask>' is not in the tokenizer's vocabulary"
  ):
    HFTokenizer(tmp_path, eos_token="<mask>")
  with pytest.raises(ValueError, match="No tokenizer.json"):
    HFTokenizer(tmp_path / "missing")


def test_char_tokenizer_token_texts_name_specials():
  tok = CharTokenizer("ab")
  assert tok.token_texts([1, 3, 4, 2, 0]) == ["<bos>", "a", "b", "<eos>", "<pad>"]


def test_hf_token_texts_are_byte_level_pieces_as_transformers_reads_them(tmp_path):
  """Each piece's bytes through transformers' own byte-level alphabet; a character split
  across tokens shows as \\xNN escapes, special tokens by name."""
  transformers = pytest.importorskip("transformers")
  from transformers.convert_slow_tokenizer import bytes_to_unicode
  from tests.hf_tokenizers import save_qwen_style

  directory = save_qwen_style(tmp_path)
  reference = transformers.AutoTokenizer.from_pretrained(directory)
  tok = HFTokenizer(directory)
  text = "Ünïcödé — ✓ 数学 🙂 Ж😀 tabs\tand <script>"  # Ж, 😀: not in the BPE corpus
  ids = tok.encode(text) + [tok.eos_id]
  byte_of = {c: b for b, c in bytes_to_unicode().items()}
  pieces = reference.convert_ids_to_tokens(ids)
  expected = [
    bytes(byte_of[c] for c in piece).decode("utf-8", "backslashreplace") for piece in pieces[:-1]
  ] + ["<|im_end|>"]
  texts = tok.token_texts(ids)
  assert texts == expected
  assert any("\\x" in t for t in texts), "the test text must split a character across tokens"
  assert not any("\ufffd" in t for t in texts)
  whole = [t for t in texts[:-1] if "\\x" not in t]
  assert whole == [reference.decode([i]) for i, t in zip(ids, texts[:-1]) if "\\x" not in t]


def test_ids_beyond_the_vocabulary_are_shown_not_raised(tmp_path):
  """A model's padded embedding rows can emit ids the tokenizer lacks: exports and the
  viewer show them as <id N?> instead of stopping the run."""
  from tests.hf_tokenizers import save_qwen_style

  hf = HFTokenizer(save_qwen_style(tmp_path))
  char = CharTokenizer("ab")
  for tok in (hf, char):
    beyond = tok.vocab_size + 2
    assert tok.token_texts([beyond, -1]) == [f"<id {beyond}?>", "<id -1?>"]
  assert char.token_texts([3, 9]) == ["a", "<id 9?>"]
