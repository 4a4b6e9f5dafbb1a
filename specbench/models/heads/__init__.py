"""EAGLE-3 heads that ship inside specbench, one directory per catalog head.

Each directory holds a head's `.tar.xz` (config.json + model.safetensors) split into `partNN.bin`
files; the catalog entry of the same name records their size and sha256, how the head was
trained and what it measured. `specbench.models.fetch.pull` joins, verifies and unpacks them into
the model cache; `benchmarks/ship_head.py` writes them from a trained head. No code here.
"""
