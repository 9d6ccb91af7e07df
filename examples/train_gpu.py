"""Rank 0's steps of a tiny random-init Llama on a GPU, its tensors placed there by the client.

    python examples/train_gpu.py --data DIR [--steps 6] [--device cuda:0]

Brings the demo config up locally over ``DIR`` (``overlord make-demo-data DIR``) and reads its two
ranks' streams, twice, from fresh clusters of the same seed: once with
``TrainerClient(device=..., pin_memory=True)`` for rank 0, which trains a bf16 ``LlamaForCausalLM``
on each microbatch (``hf_batch``: packed documents, labels already shifted), once left on the CPU.
It checks that every tensor of the first read arrived on the device and that both reads carry the
same values, and prints per step: the summed loss, the wait for data and the step's time. Needs a
CUDA device (``--device cpu`` runs the same checks without one) and ``pip install -e '.[hf]'``; nothing is downloaded.
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch
import transformers

from flight_overlord import TrainerClient
from flight_overlord.demo.run import shipped_demo_config
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.integrations.hf import MODEL_KEYS, hf_batch


def read_steps(config: Path, steps: int, step_fn, **placement) -> list[list[dict]]:
    """Rank 0's microbatches of ``steps`` steps (each handed to ``step_fn`` first); rank 1 read alongside."""
    seen = []
    with LocalCluster(config) as cluster:
        rank0 = TrainerClient(cluster.planner, 0, num_steps=steps, **placement)
        rank1 = TrainerClient(cluster.planner, 1, num_steps=steps)
        try:
            for step, (microbatches, _) in enumerate(zip(rank0, rank1)):
                step_fn(step, microbatches)
                seen.append(microbatches)
        finally:
            rank0.close()
            rank1.close()
    return seen


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="the demo corpus (overlord make-demo-data DIR)")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--device", default="cuda:0")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: --device cpu runs the same checks on the CPU")
    on_gpu = device.type == "cuda"
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=8192)
    model = transformers.LlamaForCausalLM(config).to(device=device, dtype=torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    last = [time.perf_counter()]

    def train(step: int, microbatches: list[dict]) -> None:
        waited = time.perf_counter() - last[0]
        placed = [t for mb in microbatches for t in mb.values() if isinstance(t, torch.Tensor)]
        off = [t.device for t in placed if t.device != device]
        if off:
            raise SystemExit(f"step {step}: {len(off)} tensors on {off[0]}, not {device}")
        loss_sum = 0.0
        for mb in microbatches:
            # hf_batch takes [1, S] int64 tensors (what MicrobatchView(int64=True, batch_dim=True) gives)
            loss = model(**hf_batch({name: mb[name].long().unsqueeze(0) for name in MODEL_KEYS})).loss
            loss.backward()
            loss_sum += loss.item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if on_gpu:
            torch.cuda.synchronize(device)
        now = time.perf_counter()
        print(f"step {step}: loss {loss_sum:.4f}, {len(placed)} tensors on {device}, "
              f"waited for data {waited * 1000:.1f} ms, step {(now - last[0]) * 1000:.1f} ms", flush=True)
        last[0] = time.perf_counter()

    with tempfile.TemporaryDirectory(prefix="train-gpu-") as tmp:
        work = Path(tmp)
        config = shipped_demo_config(args.data, work / "a")
        on_device = read_steps(config, args.steps, train, device=device, pin_memory=on_gpu)
        shutil.rmtree(work / "a")
        on_cpu = read_steps(shipped_demo_config(args.data, work / "b"), args.steps, lambda *_: None)
    for step, (gpu_mbs, cpu_mbs) in enumerate(zip(on_device, on_cpu)):
        for gpu_mb, cpu_mb in zip(gpu_mbs, cpu_mbs, strict=True):
            for name, value in cpu_mb.items():
                same = (torch.equal(gpu_mb[name].cpu(), value) if isinstance(value, torch.Tensor)
                        else gpu_mb[name] == value)
                if not same:
                    raise SystemExit(f"step {step}: {name!r} differs between the device read and the CPU read")
    print(f"{args.steps} steps: every tensor on {device}, the same values as the CPU read "
          f"({torch.cuda.get_device_name(device) if on_gpu else 'CPU'})")


if __name__ == "__main__":
    main()
