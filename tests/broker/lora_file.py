"""A real LoRA adapter file for the random-weight test model (processor/local/llm/model.py), for tests
that load it into llama-server with ``--lora`` and choose it per request.

llama.cpp's adapter loader (``src/llama-adapter.cpp``) wants ``general.type = "adapter"``, the base
model's ``general.architecture``, ``adapter.type = "lora"``, ``adapter.lora.alpha`` as a float32,
and for each adapted tensor ``W`` of numpy shape ``(out, in)`` a pair ``W.lora_a`` of shape
``(rank, in)`` and ``W.lora_b`` of shape ``(out, rank)``. The weights are random and large enough
(``scale``) that greedy decoding under the adapter differs from the base model's: what lets a test
tell that a request ran on the adapter.
"""

from __future__ import annotations

from pathlib import Path

from processor.local.llm.model import TinyModelSpec


def write_lora(path: Path, spec: TinyModelSpec | None = None, *, rank: int = 4, scale: float = 0.5) -> Path:
    """Write an adapter of ``rank`` on every attention and feed-forward matrix of ``spec``'s model."""
    import gguf
    import numpy as np

    spec = spec or TinyModelSpec()
    kv = spec.head_dim * spec.n_head_kv
    shapes = {
        "attn_q": (spec.n_embd, spec.n_embd),
        "attn_k": (kv, spec.n_embd),
        "attn_v": (kv, spec.n_embd),
        "attn_output": (spec.n_embd, spec.n_embd),
        "ffn_up": (spec.n_ff, spec.n_embd),
    }
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(rank))  # alpha / rank = 1: scale as written
    rng = np.random.default_rng(2026)
    for layer in range(spec.n_layer):
        for name, (out, inp) in shapes.items():
            base = f"blk.{layer}.{name}.weight"
            writer.add_tensor(f"{base}.lora_a", (rng.standard_normal((rank, inp)) * scale).astype(np.float32))
            writer.add_tensor(f"{base}.lora_b", (rng.standard_normal((out, rank)) * scale).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
