"""Tiny random-weight stand-ins for real models, built in-process (no downloads).

`make_model` builds a 2-layer Qwen2 in float32; `make_tokenizer` builds a byte-level BPE
tokenizer with a chat template; `save_pair` writes a target and a draft that share the
tokenizer to HF-style directories, as a user would pass with --target/--draft.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_model(vocab_size: int = 300, seed: int = 0, hidden: int = 64, layers: int = 2,
               init_range: float = 0.2, eos_token_id: int | None = None,
               max_position_embeddings: int = 512) -> Qwen2ForCausalLM:
    """A random Qwen2; a large init range makes next-token distributions peaky, so greedy
    decoding and drafting behave like a real model (repeats, confident stretches)."""
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings, initializer_range=init_range,
        tie_word_embeddings=False, eos_token_id=eos_token_id, bos_token_id=None,
        pad_token_id=None, attn_implementation="sdpa", dtype="float32",
    )
    model = Qwen2ForCausalLM(cfg).eval()
    return model


def perturbed_copy(model: Qwen2ForCausalLM, noise: float, seed: int = 1) -> Qwen2ForCausalLM:
    """Same architecture and vocabulary, weights moved by Gaussian noise: a draft that agrees
    with the target often but not always."""
    copy = Qwen2ForCausalLM(model.config).eval()
    copy.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in copy.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise * p.std().clamp_min(1e-3))
    return copy


def make_tokenizer(merges: tuple[tuple[str, str], ...] = ()) -> PreTrainedTokenizerFast:
    """Byte-level BPE with no merges: every UTF-8 byte is a token, plus three specials (and a
    token for each pair of `merges`, after them, merged where the tokenizer meets it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    for s in specials:
        vocab[s] = len(vocab)
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_pair(root: Path, draft_noise: float = 0.05, seed: int = 0, hidden: int = 64,
              max_position_embeddings: int = 512) -> tuple[Path, Path]:
    """Write target/ and draft/ model directories sharing one tokenizer; returns their paths.
    `hidden` / 4 is the head dimension (vLLM's CPU attention needs at least 32)."""
    tok = make_tokenizer()
    vocab = len(tok)
    target = make_model(vocab_size=vocab, seed=seed, eos_token_id=tok.eos_token_id, hidden=hidden,
                        max_position_embeddings=max_position_embeddings)
    draft = perturbed_copy(target, draft_noise, seed=seed + 1)
    paths = []
    for name, model in (("target", target), ("draft", draft)):
        d = root / name
        model.save_pretrained(d)
        tok.save_pretrained(d)
        paths.append(d)
    return paths[0], paths[1]


def make_head(target, draft_vocab_size: int | None = None, aux_layers=(0, 1, 2), seed: int = 0,
              norm_before_residual: bool = True, std: float = 0.2, fit: bool = True):
    """A random-weight EAGLE-3 head for `target` (its hidden size, rotary settings, shared
    embedding), over a seeded random draft vocabulary of `draft_vocab_size` target ids (all of
    them when None). A large init std makes its drafts vary with context. `fit`: checked
    against the target and on its dtype, ready for the engine."""
    from specbench.models.eagle3 import fit_to_target
    from specbench.models.eagle3_train import head_config_for, init_head

    vocab = int(target.get_output_embeddings().weight.shape[0])
    size = draft_vocab_size or vocab
    g = torch.Generator().manual_seed(seed + 100)
    ids = torch.randperm(vocab, generator=g)[:size].sort().values
    cfg = head_config_for(target, draft_vocab_size=size, aux_layers=aux_layers,
                          intermediate_size=2 * target.config.hidden_size,
                          norm_before_residual=norm_before_residual)
    head = init_head(target, cfg, ids, seed=seed)
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() == 2:
                p.normal_(0.0, std, generator=g)
    head = head.eval().requires_grad_(False)
    return fit_to_target(head, target, path="<tiny head>", target_name="tiny") if fit else head
