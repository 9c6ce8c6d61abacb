"""A model whose weights do not all fit: accelerate's ``device_map`` offloads some layers (here to disk),
leaving their parameters on the meta device between forwards and bringing them in for each.

Before, memory.params counted the meta parameters as if held: 2.75 MiB for a 4-layer Llama whose 2
resident layers, embeddings and head hold 1.63 MiB. Truth: the bytes of the storages the script's own
model holds on the CPU.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from lmprof.record.catalogue import memory_key
from script_truth import run_with_truth

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

SCRIPT = """
import json, sys, torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
ckpt, offload = sys.argv[2], sys.argv[3]
torch.manual_seed(0)
LlamaForCausalLM(LlamaConfig(num_hidden_layers=4, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=256, bos_token_id=0, eos_token_id=0,
                             pad_token_id=0)).save_pretrained(ckpt)
device_map = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "cpu", "model.layers.2": "disk",
              "model.layers.3": "disk", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
m = AutoModelForCausalLM.from_pretrained(ckpt, device_map=device_map, offload_folder=offload).eval()
x = torch.randint(1, 256, (2, 8))
with torch.no_grad():
    for i in range(5):
        m.generate(x, max_new_tokens=4, min_new_tokens=4, attention_mask=torch.ones_like(x))
held = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in m.parameters() if p.device.type == "cpu"}
meta = sum(p.numel() for p in m.parameters() if p.is_meta)
open(sys.argv[1], "w").write(json.dumps({"held": sum(held.values()), "meta": meta}))
"""


def test_offloaded_parameters_hold_no_memory_here(tmp_path: Path, cli) -> None:
    run, truth = run_with_truth(cli, tmp_path, SCRIPT, "offload", str(tmp_path / "ckpt"), str(tmp_path / "offload"),
                                infer=True)
    assert truth["meta"] > 0  # accelerate did offload
    params = run.metrics[memory_key("params")]
    assert params.value == truth["held"]
    assert f"{truth['meta']:,} were offloaded" in params.note
