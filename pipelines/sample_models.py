"""Tiny random-weight Hugging Face models to try the model flags offline (nothing downloaded):

    python -m rescore.pipelines.sample_models models

writes models/teacher (2-layer Llama causal LM), models/student (2-layer GPT-2 causal LM),
models/reward (2-layer Llama sequence-classification reward model) and models/tokenizer (a
word-level tokenizer whose token i reads "w{i}"), all over the 32,000-token vocabulary of
`rescore sample` data. Their numbers mean nothing; they exercise the same code as real models.
"""

from __future__ import annotations

import os
import sys

VOCAB = 32000
CONTEXT = 256


def _tokenizer(vocab: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"w{i}": i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(words, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", pad_token="w0")


def write_tiny_models(directory: str, *, vocab: int = VOCAB, context: int = CONTEXT, seed: int = 0) -> dict[str, str]:
    """Write the four directories; returns {name: path}."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    torch.manual_seed(seed)
    llama = dict(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=context, tie_word_embeddings=True,
    )
    paths = {name: os.path.join(directory, name) for name in ("teacher", "student", "reward", "tokenizer")}
    LlamaForCausalLM(LlamaConfig(**llama)).save_pretrained(paths["teacher"])
    GPT2LMHeadModel(GPT2Config(
        vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=context, bos_token_id=vocab - 1, eos_token_id=vocab - 1
    )).save_pretrained(
        paths["student"]
    )
    LlamaForSequenceClassification(LlamaConfig(**llama, num_labels=1, pad_token_id=0)).save_pretrained(paths["reward"])
    _tokenizer(vocab).save_pretrained(paths["tokenizer"])
    return paths


def echo_verifier(prompt: str, response: str) -> float:
    """A sample --reward-fn over decoded text: the fraction of response words that also occur
    in the prompt (try: --reward-fn rescore.pipelines.sample_models:echo_verifier --tokenizer DIR)."""
    words = response.split()
    if not words:
        return 0.0
    seen = set(prompt.split())
    return sum(w in seen for w in words) / len(words)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        print("usage: python -m rescore.pipelines.sample_models DIR", file=sys.stderr)
        return 2
    try:
        import tokenizers  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"rescore: error: the tiny models need the [models] extra ({e.name} is not installed): "
              "pip install 'rescore[models]' (from the repository: .venv/bin/pip install '.[models]')", file=sys.stderr)
        return 2
    for name, path in write_tiny_models(argv[0]).items():
        print(f"{name:10s} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
