"""A tiny deterministic PyTorch training run that checkpoints and resumes, for the job tests.

Why it exists: issue 26's tests need a real training run whose result does not depend on being
interrupted. This script trains a small MLP (random weights seeded from ``--seed``) on a synthetic
seeded regression set, alone or under ``torchrun`` (torch.distributed with gloo on CPU, from
torchrun's environment), and:

- saves a checkpoint (model, optimizer, step, RNG states) atomically into
  ``$GPULAB_CHECKPOINT_DIR`` every ``--ckpt-every`` steps and after the step during which it got
  SIGUSR1 (what the job runner forwards for a platform checkpoint or a preemption warning);
- resumes from ``$GPULAB_RESUME`` (the newest checkpoint, as the runner names it) when set;
- prints ``step N loss X`` for every step and ``final loss X`` at the end, X at full precision
  (``repr``), so that a resumed run's output can be compared with an uninterrupted one's.

Every step's batch is drawn from a generator seeded by (seed, step), and the model runs on one
thread, so the same world size gives the same final loss however often the run was stopped.
Under torchrun every rank reports the step of the checkpoint it can read, and the lowest rank
holding the newest one loads it and broadcasts it: nodes need not share a home.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

FEATURES = 16
SAMPLES = 512
BATCH = 64

_checkpoint_asked = False


def _on_usr1(signum, frame):
    global _checkpoint_asked
    _checkpoint_asked = True


def dataset(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    w = torch.randn(FEATURES, 1, generator=g)
    y = torch.tanh(x @ w) + 0.05 * torch.randn(SAMPLES, 1, generator=g)
    return x, y


def model_for(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 1))


def batch_indices(seed: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(0, SAMPLES, (BATCH,), generator=g)


def ckpt_step(path: str) -> int:
    """The step a checkpoint file holds, or -1 when it cannot be read."""
    try:
        return int(torch.load(path, map_location="cpu", weights_only=False)["step"])
    except Exception:
        return -1


def save(ckdir: str, state: dict) -> str:
    """Write ``state`` as ``step-NNNNNNNN.pt`` in ``ckdir`` atomically: a temporary file beside
    the folder (never inside it, where the runner picks the newest entry), fsynced, renamed."""
    os.makedirs(ckdir, exist_ok=True)
    final = os.path.join(ckdir, f"step-{state['step']:08d}.pt")
    # Named by the global rank too: nodes that share a home (a Swarm gang) each write one, and
    # their processes may have the same pid in their containers.
    name = f".ckpt-{os.environ.get('RANK', '0')}-{os.getpid()}.tmp"
    tmp = os.path.join(os.path.dirname(os.path.abspath(ckdir)), name)
    buf = io.BytesIO()
    torch.save(state, buf)
    with open(tmp, "wb") as f:
        f.write(buf.getvalue())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    fd = os.open(ckdir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return final


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--ckpt-every", type=int, default=20, help="0: only on SIGUSR1")
    ap.add_argument("--sleep", type=float, default=0.0, help="seconds per step (to be interrupted)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--lr", type=float, default=0.01)
    args = ap.parse_args(argv)

    signal.signal(signal.SIGUSR1, _on_usr1)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    ckdir = os.environ.get("GPULAB_CHECKPOINT_DIR") or os.path.abspath("checkpoints")
    resume = os.environ.get("GPULAB_RESUME", "")

    x, y = dataset(args.seed)
    model = model_for(args.seed)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    start = 0

    # Which rank holds the newest readable checkpoint: it loads, the others receive it.
    mine = ckpt_step(resume) if resume else -1
    best = mine
    if distributed:
        t = torch.tensor([mine])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        best = int(t.item())
    if best >= 0:
        holder = torch.tensor([rank if mine == best else world])
        if distributed:
            dist.all_reduce(holder, op=dist.ReduceOp.MIN)
        state = (
            [torch.load(resume, map_location="cpu", weights_only=False)] if mine == best else [None]
        )
        if distributed:
            dist.broadcast_object_list(state, src=int(holder.item()))
        ck = state[0]
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        torch.set_rng_state(ck["rng"])
        start = int(ck["step"])
        print(f"resumed from {resume or '(another rank)'} at step {start}", flush=True)
    elif resume:
        print(f"could not read {resume}; starting from step 0", file=sys.stderr, flush=True)

    net = nn.parallel.DistributedDataParallel(model) if distributed else model
    loss_fn = nn.MSELoss()
    global _checkpoint_asked
    for step in range(start + 1, args.steps + 1):
        idx = batch_indices(args.seed, step)
        shard = idx[rank::world]
        opt.zero_grad()
        loss = loss_fn(net(x[shard]), y[shard])
        loss.backward()
        opt.step()
        reported = loss.detach().clone()
        asked = torch.tensor([1 if _checkpoint_asked else 0])
        if distributed:
            dist.all_reduce(reported)
            reported /= world
            dist.all_reduce(asked, op=dist.ReduceOp.MAX)  # all ranks agree on the step
        if rank == 0:
            print(f"step {step} loss {reported.item()!r}", flush=True)
        periodic = args.ckpt_every > 0 and step % args.ckpt_every == 0
        if (periodic or asked.item()) and step < args.steps and local_rank == 0:
            # Every node's first process writes it (identical on every rank after DDP's
            # all-reduce): a node that does not share a home still has one.
            state = {
                "step": step,
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "rng": torch.get_rng_state(),
                "world": world,
            }
            path = save(ckdir, state)
            print(f"checkpoint step {step} {path}", flush=True)
        _checkpoint_asked = False
        if args.sleep:
            time.sleep(args.sleep)

    with torch.no_grad():
        final = loss_fn(model(x), y)
    if rank == 0:
        print(f"final loss {final.item()!r}", flush=True)
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
