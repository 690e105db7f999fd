"""The tokenizer built from GGUF metadata equals transformers' own GGUF conversion, token for token."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from engine.gguf_file import GGUFFile
from engine.gguf_tokenizer import tokenizer_from_gguf

try:
    from test_weights import make_hf_model, make_tokenizer, write_gguf
except ImportError:  # tests/ imported as a package
    from tests.test_weights import make_hf_model, make_tokenizer, write_gguf

PROMPTS = Path(__file__).resolve().parents[2] / "shared" / "bench" / "prompts.jsonl"
TEXTS = [
    "Hello  world\n\n  123456 don't I'LL ÄÖü café 你好, мир! 🙂",
    "def fib(n):\n\tif n < 2:\n\t\treturn n\n    return fib(n-1)+fib(n-2)\r\n",
    "   leading and trailing   ", "<|im_start|>user\nhi<|im_end|>\n", "a\u0301 e\u0301",  # combining marks: no normalization
    "",
]


def same(path: Path, texts: list[str]) -> None:
    ours = tokenizer_from_gguf(path, GGUFFile(path).metadata)
    ref = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in texts:
        assert ours.encode(text) == ref.encode(text), repr(text)
        assert ours.decode(ours.encode(text)) == ref.decode(ref.encode(text)), repr(text)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there"}]
    assert ours.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
        ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert (ours.eos_token_id, ours.bos_token_id) == (ref.eos_token_id, ref.bos_token_id)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_tiny_gguf_tokenizer_matches_transformers(tmp_path, arch):
    tok = make_tokenizer()
    path = write_gguf(tmp_path / f"{arch}.gguf", make_hf_model(arch, len(tok)), tok, "F16")
    same(path, TEXTS)


@pytest.mark.embedded
def test_embedded_target_tokenizer_matches_transformers():
    from engine.provision import default_pair

    target, _ = default_pair()
    texts = list(TEXTS)
    if PROMPTS.is_file():
        texts += [m["content"] for line in PROMPTS.read_text().splitlines() if line.strip()
                  for m in json.loads(line)["messages"]]
    same(target, texts)
