"""A user's training script for scripts/gpu_check.py: Hugging Face GPT-2 (random weights, built from a
config, so it runs offline) trained on random tokens with AdamW, bf16 autocast on CUDA.

It knows nothing about lmprof: the check runs it as ``lmprof run scripts/gpu_user_train.py ...``.
``--ddp`` wraps the model in DistributedDataParallel on a one-rank process group (nccl on CUDA, gloo
on the CPU), the only way one GPU runs lmprof's NCCL path: ``lmprof train --nproc 1`` is a plain
single process by design (torchrun only starts for two ranks or more).
"""
from __future__ import annotations

import argparse
import os
import socket

import torch
from transformers import GPT2Config, GPT2LMHeadModel

MARKER = "gpu_user_train: done"  # the check looks for this line: the script's stdout left alone


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--n-layer", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--ddp", action="store_true")
    args = ap.parse_args()

    device = torch.device(args.device)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=args.n_layer)).to(device).train()
    train_model: torch.nn.Module = model
    if args.ddp:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(free_port())), ("RANK", "0"),
                           ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
            os.environ.setdefault(key, value)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        train_model = DistributedDataParallel(model, device_ids=[device.index or 0] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    vocab = model.config.vocab_size
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    loss = torch.zeros(())
    for _ in range(args.steps):
        x = torch.randint(0, vocab, (args.batch_size, args.seq_len), device=device)
        with amp:
            loss = train_model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    print(f"{MARKER}: {args.steps} steps, last loss {float(loss):.3f}", flush=True)
    if args.ddp:
        import torch.distributed as dist

        dist.destroy_process_group()


if __name__ == "__main__":
    main()
