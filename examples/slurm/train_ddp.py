"""A minimal DDP script for examples/slurm/ddp.toml: everything it needs comes from the
environment orch sets for each process (no torchrun, no srun arithmetic in the script)."""
import os
import sys

import torch
import torch.distributed as dist


def main() -> None:
    # RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are read by init_process_group itself.
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    # CUDA_VISIBLE_DEVICES holds this process's one GPU (by UUID): it is cuda:0 here.
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model = torch.nn.Linear(32, 10).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(100):
        x = torch.randn(64, 32, device=device)
        loss = ddp(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if rank == 0:
        print(f"done: {world} processes on {os.environ.get('NNODES', '1')} node(s)")
    # Once DDP has wrapped a model, torch keeps the process group (and gloo's or NCCL's threads)
    # alive past `destroy_process_group`; torn down by the interpreter's exit while they run,
    # they can abort a finished process. So: wait for every rank, destroy the group, flush, and
    # end at once (examples/python/ddp_torch.py says more).
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
