"""Stand-ins for the model tests: fake catalog entries backed by fake wheels, and a tiny GGUF
written from tests/tiny.py's random Qwen2 (so the converter is tested end to end offline)."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import numpy as np
import torch

import tiny
from specbench.models.catalog import CatalogEntry, WheelPart


def make_fake_entry(root: Path, chunks: list[bytes], name: str = "fake-model",
                    sha256: str | None = None, members: list[str] | None = None) -> tuple[CatalogEntry, list[Path]]:
    """A catalog entry whose parts are `chunks`, each stored in its own wheel under `root`.
    `members` overrides the member name written into each wheel (to fake a missing member)."""
    root.mkdir(parents=True, exist_ok=True)
    parts, wheels = [], []
    for i, chunk in enumerate(chunks, 1):
        part = WheelPart(f"fake-part{i}", "1.0", f"fake_part{i}/data/part{i:02d}.bin")
        wheel = root / f"fake_part{i}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(f"fake_part{i}/__init__.py", "")
            zf.writestr(members[i - 1] if members else part.member, chunk)
        parts.append(part)
        wheels.append(wheel)
    whole = b"".join(chunks)
    entry = CatalogEntry(name=name, description="fake", parts=tuple(parts), size=len(whole),
                         sha256=sha256 or hashlib.sha256(whole).hexdigest())
    return entry, wheels


def write_tiny_gguf(path: Path, quantize_ffn: bool = True) -> tuple[Path, torch.nn.Module]:
    """Write tiny.make_model()'s weights and tiny.make_tokenizer()'s vocabulary as a qwen2 GGUF;
    FFN matrices as Q8_0 blocks so the converter has real dequantization to do. Returns the
    path and the float32 reference model."""
    import gguf

    tok = tiny.make_tokenizer()
    vocab = tok.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    specials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
    model = tiny.make_model(vocab_size=len(tokens), hidden=64, layers=2,
                            eos_token_id=vocab["<|im_end|>"], init_range=0.05)
    cfg = model.config
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name("tiny qwen2")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if quantize_ffn else gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in specials else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges([])
    w.add_token_scores([0.0] * len(tokens))  # an empty merges array reads as absent
    # As in the real Qwen2.5 instruct GGUFs: eos is <|im_end|>, bos/pad <|endoftext|>.
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.add_bos_token_id(vocab["<|endoftext|>"])
    w.add_pad_token_id(vocab["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.add_chat_template(tiny.CHAT_TEMPLATE)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, cfg.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, hf_name
        data = tensor.float().numpy()
        if quantize_ffn and "mlp" in hf_name:
            q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(gguf_name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(gguf_name, np.ascontiguousarray(data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, model
