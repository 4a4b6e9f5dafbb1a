"""EAGLE-3 draft heads: the module, the two public on-disk formats, loading and checks.

An EAGLE-3 head is one decoder layer that drafts from the target's own hidden states:

    fc          Linear(3 * H_target -> H, no bias), applied to the target's features only: the
                residual stream at three target layers, concatenated per position
    layers.0    one decoder layer whose attention input is [input_layernorm(token embedding),
                hidden_norm(hidden)] (2H wide: q/k/v read 2H, o_proj writes H); the residual
                is the hidden state (after hidden_norm when `norm_before_residual` is set);
                then a SwiGLU MLP, as in a llama layer
    norm        the final RMSNorm, before `lm_head`
    lm_head     Linear(H -> draft vocabulary); draft id i is target id i + d2t[i], and t2d marks
                the target ids the draft vocabulary covers

The token embedding is the target's (the head may ship its own `embed_tokens`). Later draft
steps feed back the layer's own output before `norm` in place of the target's features.

Feature layers: layer id i means the INPUT of target decoder layer i (the residual stream
before it runs), as vLLM, SGLang and the original EAGLE-3 code collect them; the default is
(2, L // 2, L - 3) for an L-layer target. `specbench.engine.model.ModelRunner.set_capture`
captures exactly these.

Formats (both from a local directory, safetensors or a PyTorch .bin read with
`weights_only=True`; nothing from the directory is ever executed):

- `speculators` (vllm-project/speculators): config.json with `speculators_model_type:
  "eagle3"`, a llama decoder config under `transformer_layer_config`, `draft_vocab_size`,
  `norm_before_residual` (true when absent, as vLLM reads it), `target_hidden_size`,
  `eagle_aux_hidden_state_layer_ids`, `speculators_config`; weights `fc.weight`,
  `layers.0.*`, `norm.weight`, `lm_head.weight`, `d2t`, `t2d`.
- `eagle3` (the original EAGLE-3 release): a llama-style config.json with `draft_vocab_size`
  (layer ids, when given, under `eagle_config`); weights `midlayer.*` in place of `layers.0.*`;
  `norm_before_residual` false when absent.

Boundary: tensors and files; the drafting loop lives in specbench.engine.drafters.eagle3.
"""

from typing import TYPE_CHECKING

from specbench.lazy import exports

if TYPE_CHECKING:  # the names below, for readers and type checkers; each loads on first use
    from specbench.models.eagle3.formats import (
        build_head,
        describe,
        fit_to_target,
        load_head,
        output_rows,
        parse_config,
        read_head,
        read_weights,
        save_head,
    )
    from specbench.models.eagle3.module import (
        FORMATS,
        Eagle3Head,
        HeadConfig,
        default_aux_layers,
    )

__getattr__, __dir__ = exports(__name__, {
    "build_head": "specbench.models.eagle3.formats",
    "describe": "specbench.models.eagle3.formats",
    "fit_to_target": "specbench.models.eagle3.formats",
    "load_head": "specbench.models.eagle3.formats",
    "output_rows": "specbench.models.eagle3.formats",
    "parse_config": "specbench.models.eagle3.formats",
    "read_head": "specbench.models.eagle3.formats",
    "read_weights": "specbench.models.eagle3.formats",
    "save_head": "specbench.models.eagle3.formats",
    "FORMATS": "specbench.models.eagle3.module",
    "Eagle3Head": "specbench.models.eagle3.module",
    "HeadConfig": "specbench.models.eagle3.module",
    "default_aux_layers": "specbench.models.eagle3.module",
})

__all__ = ["FORMATS", "Eagle3Head", "HeadConfig", "build_head", "default_aux_layers", "describe",
           "fit_to_target", "load_head", "output_rows", "parse_config", "read_head", "read_weights",
           "save_head"]
