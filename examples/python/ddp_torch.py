"""Two GPUs with one line, then PyTorch DistributedDataParallel on them.

    python examples/python/ddp_torch.py            # on a GPU box: NCCL, one process per leased GPU
    ORCH_DEVICES=sim:examples/sim/lab-8gpu.toml python examples/python/ddp_torch.py

orch chooses the two devices (least loaded, claimed atomically, so two people starting this at
once never share a GPU) and points CUDA at them before torch is imported. Without a usable GPU
(the CPU, or simulated GPUs) the same script runs DDP on the CPU: the gloo backend, one process
per leased device, or two processes when the only device is the CPU.
"""

import os
import socket
import sys

import orch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(rank: int, world: int, port: int, steps: int) -> None:
    # Imported here: the parent applied the lease before any process imported torch, and the
    # children inherit its CUDA_VISIBLE_DEVICES.
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    device = torch.device(f"cuda:{rank}") if cuda else torch.device("cpu")
    torch.manual_seed(0)  # the same initial weights on every replica (DDP broadcasts rank 0's too)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
    ).to(device)
    ddp = DDP(model, device_ids=[rank] if cuda else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    # Each replica gets its own shard of a synthetic regression problem.
    generator = torch.Generator().manual_seed(1000 + rank)
    true_w = torch.arange(16, dtype=torch.float32) / 16
    for step in range(steps):
        x = torch.randn(64, 16, generator=generator)
        y = (x @ true_w).unsqueeze(1)
        loss = torch.nn.functional.mse_loss(ddp(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()  # gradients are averaged across the replicas here
        optimizer.step()
        if rank == 0 and (step % 10 == 0 or step == steps - 1):
            print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)
    # Every replica ends with the same parameters: that is what DDP guarantees.
    flat = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
    gathered = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    same = all(torch.allclose(gathered[0], g) for g in gathered)
    if rank == 0:
        print(f"replicas agree: {same}", flush=True)
    # The ending is written this way for a reason; copy it. Once DDP has wrapped a model, torch
    # keeps the process group alive inside its C++ side: after `destroy_process_group` gloo's
    # threads (and rank 0's store server) go on running, whatever Python frees. Left to the
    # interpreter's exit, they are torn down while still running, and now and then that aborts
    # the process after training succeeded ("terminate called without an active exception",
    # SIGABRT). So: every rank waits for the others, the group is destroyed (the store is no
    # longer needed), output is flushed, and the process ends at once with `os._exit`: the
    # kernel stops those threads, with no teardown left to race them. Nothing may come after.
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if same else 1)


def main() -> None:
    gpus = [d for d in orch.devices() if d.backend != "cpu"]
    # One line: two devices, chosen and held for this process's life, CUDA pointed at them.
    lease = orch.use(gpus=2 if len(gpus) >= 2 else 1, wait=True, timeout="10m")
    print(f"leased {lease.id}: " + ", ".join(f"GPU {d.physical_index} ({d.uuid[:12]})" for d in lease.devices))
    print(f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']}")

    import torch
    import torch.multiprocessing as mp

    if torch.cuda.is_available():
        world = torch.cuda.device_count()
        print(f"DDP on {world} GPU(s), NCCL")
    else:
        world = max(2, len(lease.devices))
        print(f"no usable GPU here: DDP on the CPU, {world} processes, gloo")
    steps = int(os.environ.get("STEPS", "50"))
    mp.spawn(train, args=(world, free_port(), steps), nprocs=world, join=True)
    lease.release()


if __name__ == "__main__":
    main()
