"""Every causal-LM family the installed transformers registers, in docs/families.md and on meta.

The full walk (the describer against each family's real random-weight model: parameters, prefill
and training FLOPs) takes minutes and writes docs/families.md (scripts/family_walk.py). Here, cheaply:
the table lists exactly the installed registry's families, and every family whose real model ran
there builds on the meta device from the same recipe with exactly the parameter count the real
model had (the table's, taken from ``sum(numel)`` of the real model).
"""
from __future__ import annotations

from pathlib import Path

import pytest

tf = pytest.importorskip("transformers")
pytest.importorskip("torch")

from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # noqa: E402

from lmprof.measure.model_facts.meta import build_on_meta  # noqa: E402
from lmprof.measure.model_facts.tiny import tiny_config  # noqa: E402

DOC = Path(__file__).resolve().parents[1] / "docs" / "families.md"


def _table() -> dict[str, dict[str, str]]:
    rows: dict[str, dict[str, str]] = {}
    head: list[str] = []
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| family |"):
            head = cells
        elif head and line.startswith("| ") and not line.startswith("|---"):
            rows[cells[0]] = dict(zip(head, cells))
    return rows


TABLE = _table()


def test_the_doc_lists_exactly_the_registered_families() -> None:
    assert set(TABLE) == set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES), (
        "docs/families.md is out of date with the installed transformers: run scripts/family_walk.py")
    built = [r for r in TABLE.values() if r["status"] != "cannot build tiny"]
    assert sum(r["status"] == "exact" for r in built) >= 0.9 * len(built)


def test_every_family_builds_on_meta_with_the_real_models_parameter_count() -> None:
    tf.logging.set_verbosity_error()
    wrong = {}
    for family, row in sorted(TABLE.items()):
        if not row["params"]:
            continue
        model = build_on_meta(tiny_config(family))
        count = sum(p.numel() for p in model.parameters())
        if count != int(row["params"].replace(",", "")):
            wrong[family] = (count, row["params"])
    assert not wrong


def test_a_heterogeneous_config_keeps_its_per_layer_kind_and_reads_back_from_its_file(tmp_path) -> None:
    # Gemma 4's full-attention layers have a head size of their own (transformers' per_layer_config). The
    # recipe moves that override to the full-attention layer it keeps, shrunk as the global head was;
    # before, the override pointed at layers the tiny model lacks, and its config.json did not read back.
    cfg = tiny_config("gemma4_text")
    model = tf.AutoModelForCausalLM.from_config(cfg)
    kinds = cfg.layer_types
    heads = [layer.self_attn.head_dim for layer in model.model.layers]
    assert "full_attention" in kinds and "sliding_attention" in kinds
    assert {h for h, k in zip(heads, kinds) if k == "full_attention"} == {32}
    assert {h for h, k in zip(heads, kinds) if k == "sliding_attention"} == {16}
    path = tmp_path / "config.json"
    path.write_text(cfg.to_json_string())
    assert tf.AutoConfig.from_pretrained(str(path), local_files_only=True).to_dict()["per_layer_config"]
