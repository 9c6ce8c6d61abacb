"""A user's generation script for scripts/gpu_check.py: Hugging Face GPT-2 (random weights, built from a
config, so it runs offline) generating greedily from a fixed prompt, several times.

It knows nothing about lmprof: the check runs it as ``lmprof run --infer scripts/gpu_user_generate.py ...``.
"""
from __future__ import annotations

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel

MARKER = "gpu_user_generate: done"  # the check looks for this line: the script's stdout left alone
PROMPT = [464, 2003, 286, 11666, 4430, 318]  # "The future of artificial intelligence is" in GPT-2's tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--n-layer", type=int, default=12)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--generations", type=int, default=6)
    args = ap.parse_args()

    device = torch.device(args.device)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=args.n_layer)).to(device).eval()
    ids = torch.tensor([PROMPT], device=device)
    n = 0
    with torch.no_grad():
        for _ in range(args.generations):
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
                                 min_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)
            n += int(out.shape[1] - ids.shape[1])
    print(f"{MARKER}: {args.generations} generations, {n} new tokens", flush=True)


if __name__ == "__main__":
    main()
