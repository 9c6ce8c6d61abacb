"""`lmprof infer` and the Python API: built-in GPT, Hugging Face GPT-2/Llama saved and reloaded, a
plain module; operator counts match what torch.profiler shows; bad input is one line, exit 2."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import lmprof
from lmprof.config import InferConfig
from lmprof.pipeline.infer import run_inference

transformers = pytest.importorskip("transformers")


def small_cfg(**kw):
    base = dict(batch_size=2, prompt_len=8, new_tokens=6, steps=2, warmup=1, profile_steps=1, device="cpu", energy="off")
    base.update(kw)
    return InferConfig(**base)


def test_builtin_gpt_prefill_and_decode(tmp_path):
    run, folder = run_inference(small_cfg(), out_dir=tmp_path / "r")
    m = run.metrics
    assert m["ttft"].unit == "ms" and m["ttft"].source == "measured" and m["ttft"].n == 2
    assert m["tpot"].n == 2 * 5 and m["tpot"].p90 >= m["tpot"].value
    assert m["decode_tokens_per_s"].unit == "tokens/s" and m["decode_tokens_per_s"].source == "derived"
    # KV cache: 2 x 4 layers x 4 heads x 32 head_dim x (8 + 6 - 1) tokens x 2 batch x 4 bytes.
    assert m["kv_cache.estimated"].value == 2 * 4 * 4 * 32 * 13 * 2 * 4
    assert m["kv_cache"].value == m["kv_cache.estimated"].value
    phases = {b.phase for b in run.blocks}
    assert {"prefill", "decode"} <= phases
    names = {b.name for b in run.blocks if b.phase == "decode"}
    assert {"attn.qkv", "attn.scores", "attn.softmax", "attn.av", "mlp.fc", "lm_head"} <= names
    assert sum(b.time_ms for b in run.blocks) == pytest.approx(m["e2e_latency"].value, rel=0.1)
    assert (folder / "trace.json.gz").is_file()


def test_no_kv_cache_is_quadratic_baseline(tmp_path):
    run, _ = run_inference(small_cfg(kv_cache=False), out_dir=tmp_path / "r")
    assert "kv_cache" not in run.metrics
    assert run.metrics["kv_cache.estimated"].value == 0


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    gpt2 = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=100,
                                   bos_token_id=99, eos_token_id=99)
    transformers.GPT2LMHeadModel(gpt2).save_pretrained(root / "gpt2")
    llama = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, vocab_size=100, max_position_embeddings=64)
    transformers.LlamaForCausalLM(llama).save_pretrained(root / "llama")
    return root


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_hf_models_load_from_local_path(saved_models, tmp_path, family):
    run, _ = run_inference(small_cfg(hf=str(saved_models / family)), out_dir=tmp_path / "r")
    decode = {b.name for b in run.blocks if b.phase == "decode"}
    assert {"embedding", "ln_1", "attn.qkv", "attn.proj", "ln_2", "mlp.fc", "mlp.proj", "ln_f", "lm_head"} <= decode
    assert run.config["model_source"] == "local path"
    assert run.metrics["kv_cache"].value > 0


def test_gpt2_operator_counts_match_the_lesson(saved_models, tmp_path):
    """HF GPT-2 generating N tokens: 4 addmm per layer per token (c_attn, c_proj, c_fc, c_proj)
    and one mm per token for the lm_head, exactly what torch.profiler's table shows."""
    n, layers = 7, 2
    run, _ = run_inference(small_cfg(hf=str(saved_models / "gpt2"), new_tokens=n, batch_size=1), out_dir=tmp_path / "r")
    ops = {o.name: o.calls for o in run.ops}
    assert ops["aten::addmm"] == layers * 4 * n
    assert ops["aten::mm"] == n


def test_hf_config_random_weights_offline(tmp_path):
    run, _ = run_inference(small_cfg(hf_config="tiny-gpt2", prompt="Hello world"), out_dir=tmp_path / "r")
    assert run.config["model_source"] == "config (random weights)"
    assert any("UTF-8 bytes" in n for n in run.notes)
    assert run.config["prompt_tokens"] == len("Hello world")


class Plain(torch.nn.Module):
    """A causal LM lmprof knows nothing about: returns logits, no cache."""

    def __init__(self, vocab=40, d=16):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.mix = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.Tanh(), torch.nn.Linear(2 * d, d))
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, ids, targets=None):
        logits = self.head(self.emb(ids) + self.mix(self.emb(ids)))
        if targets is None:
            return logits
        return logits, torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def test_plain_module_inference_api(tmp_path):
    run = lmprof.profile_inference(Plain(), torch.randint(40, (2, 5)), new_tokens=4, steps=2, out_dir=tmp_path / "a")
    assert any("re-runs the whole sequence" in n for n in run.notes)
    names = {b.name for b in run.blocks}
    assert {"emb", "mix.0", "mix.2", "head"} <= names
    run.save(tmp_path / "copy")
    assert (tmp_path / "copy" / "trace.json.gz").is_file()
    assert "lmprof infer" in lmprof.summary(run)


def test_plain_module_training_api(tmp_path):
    model = Plain()
    batches = [(torch.randint(40, (2, 6)), torch.randint(40, (2, 6)))]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = lmprof.profile_training(model, batches, opt, steps=2, warmup=1, profile_steps=1, out_dir=tmp_path / "t")
    times = {(b.name, b.phase): b.time_ms for b in run.blocks}
    assert times[("head", "forward")] > 0 and times[("head", "backward")] > 0
    assert run.metrics["tokens_per_step"].value == 12
    assert sum(times.values()) == pytest.approx(run.metrics["step_time"].value, rel=0.1)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--hf", "some-org/not-cached-model"], "not in the local Hugging Face cache"),
        (["--new-tokens", "0"], "new tokens must be positive"),
        (["--new-tokens", "-3"], "new tokens must be positive"),
        (["--prompt-len", "250", "--new-tokens", "10"], "exceeds the model's context"),
        (["--hf-config", "no-such-arch"], "unknown --hf-config"),
        (["--compile", "--no-kv-cache"], "--compile for inference needs a KV cache"),
        (["--compile", "--compile-mode", "fast"], "compile_mode: Input should be"),
    ],
)
def test_infer_bad_input(cli, args, needle):
    code, out, err = cli("infer", "--device", "cpu", *args)
    assert code == 2, err
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_path_that_is_not_a_model(cli, tmp_path):
    code, _, err = cli("infer", "--hf", str(tmp_path))
    assert code == 2 and "not a Hugging Face model folder" in err


class FakeDecoder:
    """Logits that always pick token 3; no model, so the clock alone decides the times."""

    def start(self, prompt, max_len):
        return torch.zeros(prompt.size(0), 10).index_fill_(1, torch.tensor([3]), 1.0)

    def step(self, token):
        return torch.zeros(token.size(0), 10).index_fill_(1, torch.tensor([3]), 1.0)

    def cache_bytes(self):
        return None


def test_generate_reports_each_forward_after_its_device_sync():
    """The session's clock times a generation at these calls (tests/test_protocol_timing.py): after the
    prefill and after each decode step, the device synchronized first, the token already chosen."""
    from lmprof.hardware.devices import resolve_device
    from lmprof.workloads.inference import InferWorkload, generate

    seen: list[str] = []
    device = SimpleNamespace(synchronize=lambda: seen.append("sync"), torch_device=resolve_device("cpu").torch_device)
    work = InferWorkload(model=torch.nn.Linear(1, 1), decoder=FakeDecoder(), prompt=torch.zeros(2, 5, dtype=torch.long),
                         new_tokens=4, device=device)  # type: ignore[arg-type]  # a device that logs its syncs
    tokens = generate(work, on_forward=lambda: seen.append("forward"))
    assert seen == ["sync"] + ["sync", "forward"] * 4  # one prefill and three decode steps
    assert tokens.tolist() == [[3, 3, 3, 3], [3, 3, 3, 3]]


def test_model_scopes_come_back_after_a_compiled_run(tmp_path):
    """A compiled run switches the built-in GPT's sub-block scopes off while it runs; an eager inference
    run must switch them on for itself whatever it finds (this was a real, order-dependent bug). The
    process's own setting (off here) is put back after it (tests/test_model_scopes_kept.py)."""
    from lmprof.workloads.blocks import model_scopes, model_scopes_kept

    with model_scopes_kept():
        model_scopes(False)
        run, _ = run_inference(small_cfg(), out_dir=tmp_path / "r")
    assert "attn.qkv" in {b.name for b in run.blocks if b.phase == "decode"}


@pytest.mark.slow
def test_compiled_decode_compiles_once(tmp_path, monkeypatch):
    """--compile: the static KV cache gives decode one shape, so decode compiles exactly once and
    prefill once (one prompt length), all in the warm-up generation, with no recompilation; the
    compiled model generates the eager model's tokens. Dynamo's eager backend stands in for
    inductor: the guards, and so the compilations, are the same (test_compiled_infer_... uses inductor)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, mode=None, dynamic=None: real(m, backend="eager", dynamic=dynamic))
    eager, _ = run_inference(small_cfg(new_tokens=8), out_dir=tmp_path / "e")
    torch._dynamo.reset()
    counters.clear()
    run, _ = run_inference(small_cfg(new_tokens=8, compile=True), out_dir=tmp_path / "c")
    rows = run.tables["compile"]
    assert sorted((r["function"], r["kind"], r["phase"]) for r in rows) == [
        ("gpt_decode", "compile", "warm-up"), ("gpt_prefill", "compile", "warm-up")]
    assert counters["stats"]["unique_graphs"] == 2 and counters["frames"]["total"] == 2  # dynamo's own count
    assert run.value("compile.recompiles") == 0 and run.value("compile.graph_breaks") == 0
    assert run.value("compile.per_step") == 0 and run.value("compile.after_warmup") == 0
    assert run.value("compile.time") > run.value("e2e_latency")
    assert run.tables["generation"] == eager.tables["generation"]
    torch._dynamo.reset()


def _greedy_logits(decoder, prompt: torch.Tensor, new: int = 5) -> torch.Tensor:
    """Logits of the prompt's last position and of ``new`` greedy decode steps, stacked."""
    out = [decoder.start(prompt, prompt.shape[1] + new)]
    for _ in range(new):
        out.append(decoder.step(out[-1].argmax(-1, keepdim=True)))
    return torch.stack(out)


@pytest.mark.parametrize("attention", ["math", "sdpa"])
def test_static_cache_decodes_the_same_logits_as_the_dynamic_one(attention):
    """The static KV cache (all positions, masked) gives the dynamic cache's logits at every step."""
    from lmprof.workloads.decoding import GPTDecoder
    from lmprof.workloads.gpt import GPT, preset

    torch.manual_seed(0)
    model = GPT(preset("tiny", n_layer=2, attention=attention)).eval()
    prompt = torch.randint(65, (2, 8))
    with torch.inference_mode():
        dynamic = _greedy_logits(GPTDecoder(model), prompt)
        static = _greedy_logits(GPTDecoder(model, static=True), prompt)
    assert torch.allclose(dynamic, static, atol=1e-5)


@pytest.mark.slow
def test_compiled_infer_with_inductor_gives_eager_tokens_and_named_blocks(tmp_path):
    """Inductor for real (one layer): decode and prefill compile once each; the compiled static-cache
    generation gives the eager run's tokens; decode and prefill time is in named blocks, no 'a+b' rows.

    The truth is the eager run of the same seed and sizes, not a second compile of the decoder here:
    lmprof compiles with kernel profiling on and the graph cache off (measure/compiled_kernels.py), so
    a compile outside the run would build every kernel again (6 s of g++ on 2 cores). That the static
    cache gives the dynamic cache's logits is checked eagerly, step by step, in
    test_static_cache_decodes_the_same_logits_as_the_dynamic_one."""
    import torch._dynamo

    eager, _ = run_inference(small_cfg(n_layer=1, new_tokens=6), out_dir=tmp_path / "e")
    torch._dynamo.reset()
    run, _ = run_inference(small_cfg(n_layer=1, new_tokens=6, compile=True), out_dir=tmp_path / "c")
    kinds = sorted((r["function"], r["kind"]) for r in run.tables["compile"])
    assert kinds == [("gpt_decode", "compile"), ("gpt_prefill", "compile")]
    for phase in ("prefill", "decode"):
        rows = [b for b in run.blocks if b.phase == phase]
        assert not any("+" in b.name for b in rows)
        assert {"attn.qkv", "mlp.fc", "lm_head"} <= {b.name for b in rows}
    assert run.tables["generation"] == eager.tables["generation"]
    torch._dynamo.reset()


def test_hf_static_cache_decodes_the_same_logits_as_the_dynamic_one():
    """transformers' StaticCache, as the compiled HF decoder drives it (cache_position tensors), gives
    the dynamic cache's logits at every step."""
    from lmprof.workloads import hf as hfmod
    from lmprof.workloads.decoding import HFDecoder

    model = hfmod.from_config("tiny-gpt2", torch.float32, 0).model.eval()
    prompt = torch.randint(100, (2, 8))

    static = HFDecoder(model)
    static.static = True  # the compiled path's cache, without compiling
    with torch.inference_mode():
        assert torch.allclose(_greedy_logits(HFDecoder(model), prompt), _greedy_logits(static, prompt), atol=1e-5)


@pytest.mark.slow
def test_compiled_hf_decode_compiles_once(tmp_path, monkeypatch):
    """--compile --hf-config tiny-gpt2: StaticCache, so decode compiles once and prefill once, no
    recompilation, the eager run's tokens (dynamo's eager backend stands in for inductor)."""
    import torch._dynamo

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, mode=None, dynamic=None: real(m, backend="eager", dynamic=dynamic))
    eager, _ = run_inference(small_cfg(hf_config="tiny-gpt2", new_tokens=6), out_dir=tmp_path / "e")
    torch._dynamo.reset()
    run, _ = run_inference(small_cfg(hf_config="tiny-gpt2", new_tokens=6, compile=True), out_dir=tmp_path / "c")
    rows = run.tables["compile"]
    assert sorted((r["function"], r["kind"]) for r in rows) == [("hf_decode", "compile"), ("hf_prefill", "compile")]
    assert run.value("compile.recompiles") == 0 and run.value("compile.after_warmup") == 0
    assert run.tables["generation"] == eager.tables["generation"]
    assert any("StaticCache" in n for n in run.notes)
    torch._dynamo.reset()


def test_a_reused_static_cache_gives_the_same_logits():
    """A compiled GPT decoder keeps its static cache across generations (stale positions are masked):
    a second generation with another prompt gives a fresh decoder's logits."""
    from lmprof.workloads.decoding import GPTDecoder
    from lmprof.workloads.gpt import GPT, preset

    torch.manual_seed(0)
    model = GPT(preset("tiny", n_layer=2)).eval()

    def logits(decoder, prompt):
        return _greedy_logits(decoder, prompt, new=4)

    reused = GPTDecoder(model, static=True)
    with torch.inference_mode():
        logits(reused, torch.randint(65, (2, 8)))
        first_cache = reused.cache
        second = torch.randint(65, (2, 8))
        got = logits(reused, second)
        assert reused.cache is first_cache
        assert torch.allclose(got, logits(GPTDecoder(model), second), atol=1e-5)
