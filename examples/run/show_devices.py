#!/usr/bin/env python3
"""Prints what orch handed this process: its devices, its rank, its memory hints.

Run it under orch to see the environment a real GPU job gets, with or without a GPU:
    orch run examples/run/one-task-per-gpu.toml
"""
import os
import sys

KEYS = [
    "ORCH_JOB_ID",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "ORCH_MEMORY_LIMIT_BYTES",
    "TF_FORCE_GPU_ALLOW_GROWTH",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
]

rank = os.environ.get("RANK", "-")
for key in KEYS:
    if key in os.environ:
        print(f"[rank {rank}] {key}={os.environ[key]}")

try:  # With PyTorch and a GPU, show what CUDA itself sees.
    import torch

    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            print(f"[rank {rank}] cuda:{i} = {torch.cuda.get_device_name(i)}")
except ImportError:
    pass
sys.stdout.flush()
