#!/usr/bin/env python3
"""DDP training on synthetic MNIST-shaped data: the erdma example workload.

Runs anywhere without network access: the data set is generated from a fixed seed (10 classes,
28x28 single-channel images: a class template plus noise), so the model can learn and the loss
falls within a few dozen steps.

Launch with torchrun (which sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), as the
Kubeflow training operator and Arena's `submit pytorch` do:

    torchrun --nproc-per-node 2 train.py --steps 200            # NCCL on GPUs
    torchrun --nproc-per-node 2 train.py --backend gloo --steps 30   # CPU (CI)

Output (rank 0): one `step=N loss=L step_ms=T` line every --log-every steps and a final
`TRAIN_RESULT {json}` line; `erdmactl nccl compare A.log B.log` reads both, so two runs (for
example over TCP and over eRDMA) can be compared directly.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

CLASSES = 10
SIDE = 28


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto",
                   help="process-group backend (auto: nccl when CUDA is available, else gloo)")
    p.add_argument("--steps", type=int, default=200, help="training steps")
    p.add_argument("--batch-size", type=int, default=64, help="samples per rank per step")
    p.add_argument("--samples", type=int, default=20000, help="size of the synthetic data set")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    p.add_argument("--noise", type=float, default=0.8, help="noise level of the synthetic images")
    p.add_argument("--seed", type=int, default=1234, help="seed of the data set and the model")
    p.add_argument("--log-every", type=int, default=10, help="print a step line every N steps")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the mean step time")
    p.add_argument("--check-loss-decreases", action="store_true",
                   help="exit 1 unless the mean loss of the last 10%% of steps is below that of the first 10%%")
    return p.parse_args()


def synthetic_mnist(samples, seed, noise):
    """Deterministic MNIST-shaped data: (N,1,28,28) float images and (N,) int64 labels."""
    g = torch.Generator().manual_seed(seed)
    templates = (torch.rand(CLASSES, 1, SIDE, SIDE, generator=g) > 0.7).float()
    labels = torch.randint(0, CLASSES, (samples,), generator=g)
    images = templates[labels] + noise * torch.randn(samples, 1, SIDE, SIDE, generator=g)
    images = (images - images.mean()) / images.std()
    return images, labels


class Net(nn.Module):
    """A small CNN of the classic MNIST shape."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, CLASSES)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


def env_int(name, default):
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        sys.exit(f"train.py: environment variable {name}={value!r} is not an integer")


def main():
    args = parse_args()
    rank = env_int("RANK", 0)
    world = env_int("WORLD_SIZE", 1)
    local_rank = env_int("LOCAL_RANK", 0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")

    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        if not torch.cuda.is_available():
            sys.exit("train.py: --backend nccl needs CUDA, but no GPU is visible; use --backend gloo")
        if local_rank >= torch.cuda.device_count():
            sys.exit(f"train.py: LOCAL_RANK={local_rank} needs a GPU of its own, but only "
                     f"{torch.cuda.device_count()} are visible: start at most that many processes per node")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")

    dist.init_process_group(backend=backend, rank=rank, world_size=world)
    torch.manual_seed(args.seed)

    images, labels = synthetic_mnist(args.samples, args.seed, args.noise)
    # Each rank trains on its own shard (like DistributedSampler without shuffling).
    images, labels = images[rank::world].to(device), labels[rank::world].to(device)
    shard = labels.shape[0]
    if shard < args.batch_size:
        sys.exit(f"train.py: shard of {shard} samples is smaller than --batch-size {args.batch_size}")

    model = Net().to(device)
    ddp = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)

    losses, times = [], []
    g = torch.Generator().manual_seed(args.seed + rank)
    for step in range(1, args.steps + 1):
        idx = torch.randint(0, shard, (args.batch_size,), generator=g).to(device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(images[idx]), labels[idx])
        loss.backward()
        opt.step()
        # Mean loss over ranks: one more collective per step, and the same number on every rank.
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean /= world
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1000.0)
        losses.append(mean.item())
        if rank == 0 and (step % args.log_every == 0 or step == 1):
            print(f"step={step} loss={losses[-1]:.4f} step_ms={times[-1]:.3f}", flush=True)

    steady = times[args.warmup:] or times
    step_ms = sum(steady) / len(steady)
    tenth = max(1, args.steps // 10)
    first, last = sum(losses[:tenth]) / tenth, sum(losses[-tenth:]) / tenth
    result = {
        "world": world,
        "backend": backend,
        "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if backend == "nccl" else None,
        "steps": args.steps,
        "batch_size_per_rank": args.batch_size,
        "loss_first": round(first, 4),
        "loss_last": round(last, 4),
        "step_ms_mean": round(step_ms, 3),
        "samples_per_s": round(args.batch_size * world * 1000.0 / step_ms, 1),
    }
    if rank == 0:
        print("TRAIN_RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()
    if args.check_loss_decreases and not last < first:
        sys.exit(f"train.py: loss did not decrease (first {first:.4f}, last {last:.4f})")


if __name__ == "__main__":
    main()
