"""Write the perf gate's tiny fixture models: a 2-layer random Qwen2 target and a draft that is
a noise-perturbed copy of it, sharing a byte-level tokenizer (the same recipe as tests/tiny.py,
copied because tests/ is not a package).

Everything is seeded, so two invocations on CPU in float32 write bit-identical weights:

    python benchmarks/perf_gate/make_models.py OUT_DIR            # OUT_DIR/target, OUT_DIR/draft
    python benchmarks/perf_gate/make_models.py OUT_DIR --verify benchmarks/perf_gate/models.sha256

`--verify` compares the weight files with the hashes the committed baseline was made from and
exits 2 naming the file that differs: the gate must not blame the engine for a change in its
fixtures (a transformers upgrade that initializes weights differently, say). `--write-hashes`
records them after an intentional change (see docs/ci.md, "Refreshing the baseline").
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WEIGHT_FILES = ("target/model.safetensors", "draft/model.safetensors")


def make_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE with no merges: every UTF-8 byte is a token, plus three specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    for s in specials:
        vocab[s] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_model(vocab_size: int, seed: int, eos_token_id: int,
               max_position_embeddings: int) -> Qwen2ForCausalLM:
    """A random 2-layer Qwen2; the large init range makes next-token distributions peaky, so
    greedy decoding and drafting behave like a real model and near-ties are rare."""
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings, initializer_range=0.2,
        tie_word_embeddings=False, eos_token_id=eos_token_id, bos_token_id=None,
        pad_token_id=None, attn_implementation="sdpa", dtype="float32",
    )
    return Qwen2ForCausalLM(cfg).eval()


def perturbed_copy(model: Qwen2ForCausalLM, noise: float, seed: int) -> Qwen2ForCausalLM:
    """Same architecture, weights moved by seeded Gaussian noise (relative to each tensor's
    std): a draft that agrees with the target often but not always. More noise, worse draft."""
    copy = Qwen2ForCausalLM(model.config).eval()
    copy.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in copy.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise * p.std().clamp_min(1e-3))
    return copy


def write_models(root: Path, draft_noise: float = 0.05, seed: int = 0,
                 max_position_embeddings: int = 1024) -> tuple[Path, Path]:
    """Write root/target and root/draft (safetensors + tokenizer); returns their paths."""
    tok = make_tokenizer()
    target = make_model(len(tok), seed, tok.eos_token_id, max_position_embeddings)
    draft = perturbed_copy(target, draft_noise, seed=seed + 1)
    paths = []
    for name, model in (("target", target), ("draft", draft)):
        d = root / name
        model.save_pretrained(d)
        tok.save_pretrained(d)
        paths.append(d)
    return paths[0], paths[1]


def weight_hashes(root: Path) -> dict[str, str]:
    return {rel: hashlib.sha256((root / rel).read_bytes()).hexdigest() for rel in WEIGHT_FILES}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="directory to write target/ and draft/ into")
    ap.add_argument("--draft-noise", type=float, default=0.05,
                    help="relative weight noise of the draft (default 0.05; larger = worse draft)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--verify", type=Path, metavar="FILE",
                    help="sha256sum-style file the weights must match (exit 2 otherwise)")
    ap.add_argument("--write-hashes", type=Path, metavar="FILE",
                    help="write the weights' hashes to FILE in sha256sum format")
    args = ap.parse_args(argv)

    torch.set_num_threads(1)  # tiny tensors; one thread also keeps the arithmetic order fixed
    write_models(args.out, draft_noise=args.draft_noise, seed=args.seed)
    hashes = weight_hashes(args.out)
    if args.write_hashes:
        args.write_hashes.write_text("".join(f"{h}  {rel}\n" for rel, h in hashes.items()))
    if args.verify:
        expected = {}
        for line in args.verify.read_text().splitlines():
            if line.strip():
                h, rel = line.split(maxsplit=1)
                expected[rel.strip()] = h
        for rel, h in hashes.items():
            if expected.get(rel) != h:
                print(f"error: fixture model {rel} differs from {args.verify} (the models the "
                      "baseline was made from); the comparison would not be fair: refresh the "
                      "baseline with benchmarks/perf_gate/run.sh --update-baseline",
                      file=sys.stderr)
                return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
