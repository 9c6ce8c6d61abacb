"""Sweep specs: one-line errors naming the key, the product and exclude rules counted by hand, stable ids."""
from __future__ import annotations

from pathlib import Path

import pytest

from lmprof.errors import ConfigError
from lmprof.sweep.spec import load_spec, matches, parse_spec

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "values,needle",
    [
        ({"batchsizes": [2]}, "unknown key 'batchsizes' (did you mean 'batch_sizes'?)"),
        ({"batch_sizes": []}, "batch_sizes: must not be empty"),
        ({"modes": []}, "modes: must not be empty"),
        ({"batch_sizes": [2, 0]}, "batch_sizes: values must be positive"),
        ({"batch_sizes": [2, 2]}, "batch_sizes: duplicate value 2"),
        ({"dtypes": ["fp8"]}, "dtypes.0:"),
        ({"devices": ["tpu"]}, "devices: unknown device 'tpu'"),
        ({"models": ["huge"]}, "models: entry 0: unknown preset 'huge'"),
        ({"models": [{"n_layer": 1}]}, "models.0: a model without a preset needs n_layer, n_head and n_embd"),
        ({"models": [{"n_layer": 1, "n_head": 1, "n_embd": 8, "colour": "red"}]}, "models.0.colour: unknown key"),
        ({"exclude": [{"device": "cpu", "precision": "fp16"}]}, "exclude: rule 0: unknown key 'precision'"),
        ({"exclude": [{}]}, "exclude: rule 0 must be a non-empty mapping"),
        ({"exclude": ["cpu"]}, "exclude: rule 0 must be a non-empty mapping"),
        ({"exclude": {"device": "cpu"}}, "exclude: must be a list of rules"),
        ({"steps": 0}, "steps: must be at least 1"),
        ({"repeats": 0}, "repeats: must be at least 1"),
        ({"timeout_s": -1}, "timeout_s: must be positive"),
        ({"attention": ["flash"]}, "attention.0:"),
    ],
)
def test_bad_spec_is_one_line_naming_the_key(values, needle):
    with pytest.raises(ConfigError) as info:
        parse_spec(values, "my.yaml")
    text = str(info.value)
    assert text.startswith("my.yaml: ")
    assert needle in text
    assert "\n" not in text


def test_spec_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("batch_sizes: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_spec(bad)
    with pytest.raises(Exception, match="not found"):
        load_spec(tmp_path / "missing.yaml")


def test_product_and_exclude_rules_counted_by_hand():
    spec = parse_spec({
        "models": ["tiny", {"name": "mini", "n_layer": 1, "n_head": 2, "n_embd": 32}],  # 2
        "batch_sizes": [1, 2, 4],                                                     # 3
        "seq_lens": [16, 32],                                                          # 2
        "devices": ["cpu", "cuda"],                                                    # 2
        "dtypes": ["fp32", "fp16"],                                                    # 2
        "modes": ["train", "infer"],                                                   # 2 -> 96 combinations
        "exclude": [
            {"device": "cpu", "dtype": "fp16"},            # 2*3*2*1*1*2 = 24
            {"model": "mini", "batch_size": [2, 4]},       # 1*2*2*2*2*2 = 32, of which 8 already cpu+fp16
            {"mode": "infer", "dtype": "bf16"},            # matches nothing
        ],
        "repeats": 2,
    })
    plan = spec.expand()
    assert plan.excluded == 24 + 32 - 8
    assert len(plan.points) == (96 - 48) * 2
    assert plan.unused_rules == [{"mode": "infer", "dtype": "bf16"}]
    assert not any(p.device == "cpu" and p.dtype == "fp16" for p in plan.points)
    assert not any(p.model == "mini" and p.batch_size in (2, 4) for p in plan.points)


def test_ids_are_stable_distinct_and_follow_the_config():
    values = {"models": ["tiny"], "batch_sizes": [2, 4], "repeats": 2}
    a = parse_spec(values).expand().points
    b = parse_spec(values).expand().points
    assert [p.id for p in a] == [p.id for p in b]
    assert len({p.id for p in a}) == 4  # repeats are separate runs with their own ids
    changed = parse_spec({**values, "steps": 7}).expand().points
    assert not {p.id for p in a} & {p.id for p in changed}


def test_model_entries_resolve_to_explicit_dimensions():
    spec = parse_spec({"models": ["small", {"n_layer": 2, "n_head": 2, "n_embd": 64},
                                 {"name": "deep", "preset": "tiny", "n_layer": 8}]})
    labels = [m.label for m in spec.models]
    assert labels == ["small", "L2-H2-E64", "deep"]
    points = {p.model: p for p in spec.expand().points}
    assert points["small"].model_spec["n_embd"] == 384
    assert points["L2-H2-E64"].model_spec == {"preset": "tiny", "n_layer": 2, "n_head": 2, "n_embd": 64,
                                              "block_size": 256, "vocab_size": 65}
    assert points["deep"].model_spec["n_layer"] == 8 and points["deep"].model_spec["n_embd"] == 128


def test_scalars_become_lists_and_exclude_matching():
    spec = parse_spec({"compile": True, "batch_sizes": 4, "energy": False})
    assert spec.compile == [True] and spec.batch_sizes == [4] and spec.energy == "off"
    where = {"device": "cpu", "dtype": "fp16", "compile": False}
    assert matches({"device": "CPU", "dtype": ["bf16", "fp16"]}, where)
    assert not matches({"device": "cpu", "compile": True}, where)


def test_run_values_map_sequence_length_per_mode():
    spec = parse_spec({"modes": ["train", "infer"], "seq_lens": [48], "new_tokens": 5, "steps": 2})
    train, infer = spec.expand().points
    assert train.run_values("out")["seq_len"] == 48 and "prompt_len" not in train.run_values("out")
    iv = infer.run_values("out")
    assert iv["prompt_len"] == 48 and iv["new_tokens"] == 5 and iv["steps"] == 2 and "seq_len" not in iv


def test_shipped_specs_are_valid():
    quick = load_spec(REPO / "sweeps" / "quick.yaml").expand()
    assert 4 <= len(quick.points) <= 32
    full = load_spec(REPO / "sweeps" / "full.yaml").expand()
    assert len(full.points) > len(quick.points)
