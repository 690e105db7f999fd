"""The tokenizer built from GGUF metadata equals transformers' own GGUF conversion, token for token."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from engine.io.gguf_file import GGUFFile
from engine.io.gguf_tokenizer import tokenizer_from_gguf

try:
    from test_weights import make_hf_model, make_tokenizer, write_gguf
except ImportError:  # tests/ imported as a package
    from tests.engine.test_weights import make_hf_model, make_tokenizer, write_gguf

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
    chats = [
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there"}],
        [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "ü 🙂"}],
    ]
    for msgs in chats:
        for gen in (True, False):
            text = ours.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
            assert text == ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
            ids = ref.apply_chat_template(msgs, tokenize=True, add_generation_prompt=gen)
            assert ours.apply_chat_template(msgs, add_generation_prompt=gen) == list(getattr(ids, "input_ids", ids))
    assert (ours.eos_token_id, ours.bos_token_id) == (ref.eos_token_id, ref.bos_token_id)
    assert ours.get_vocab() == ref.get_vocab() and len(ours) == len(ref)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_tiny_gguf_tokenizer_matches_transformers(tmp_path, arch):
    tok = make_tokenizer()
    path = write_gguf(tmp_path / f"{arch}.gguf", make_hf_model(arch, len(tok)), tok, "F16")
    same(path, TEXTS)


@pytest.mark.embedded
def test_embedded_target_tokenizer_matches_transformers():
    from engine.io.provision import default_pair

    target, _ = default_pair()
    texts = list(TEXTS)
    if PROMPTS.is_file():
        texts += [m["content"] for line in PROMPTS.read_text().splitlines() if line.strip()
                  for m in json.loads(line)["messages"]]
    same(target, texts)


def test_gguf_tokenizer_needs_no_transformers(tmp_path):
    """Loading a GGUF model's tokenizer must not import transformers (about 1.5 s of every load)."""
    tok = make_tokenizer()
    path = write_gguf(tmp_path / "q.gguf", make_hf_model("qwen2", len(tok)), tok, "F16")
    code = ("import sys; from pathlib import Path; from engine.io.gguf_file import GGUFFile; "
            "from engine.io.gguf_tokenizer import tokenizer_from_gguf; p = Path(sys.argv[1]); "
            "t = tokenizer_from_gguf(p, GGUFFile(p).metadata); t.apply_chat_template([{'role': 'user', 'content': 'x'}]); "
            "print('transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_a_template_that_raises_gives_a_clear_error():
    from tokenizers import Tokenizer, models

    from engine.io.chat_tokenizer import ChatTokenizer, TemplateError

    t = ChatTokenizer(Tokenizer(models.BPE()), bos_token=None, eos_token=None,
                      chat_template="{{ raise_exception('roles must alternate') }}")
    with pytest.raises(TemplateError, match="roles must alternate"):
        t.apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(TemplateError, match="no chat template"):
        ChatTokenizer(Tokenizer(models.BPE()), bos_token=None, eos_token=None).apply_chat_template([])
