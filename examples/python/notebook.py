# %% [markdown]
# # A notebook that takes its GPU with orch
#
# Each `# %%` block is a cell (VS Code, Jupytext and Spyder run them as such); run as a script it
# does the same top to bottom. The first cell takes the GPU, before any framework is imported:
# the kernel then holds it until `lease.release()` or a kernel restart, and nobody else's
# notebook can take the same card meanwhile.

# %%
import orch

for d in orch.devices():
    print(
        f"GPU {d.index} (CUDA {d.cuda_index}) {d.name}: "
        f"{(d.memory_free_bytes or 0) / 2**30:.1f} GiB free, {d.utilization_gpu_percent}% busy, "
        f"held by {d.held_by or '-'}"
    )

# %%
# What would I get? A dry run: the policy's choice, its reason, and why not the others.
plan = orch.plan(gpus=1, policy="most-free-memory")
print(plan.reason)
for r in plan.rejected:
    print(f"  not GPU {r.physical_index}: {r.why}")

# %%
# The one line that replaces `os.environ["CUDA_VISIBLE_DEVICES"] = "1"`.
lease = orch.use(gpus=1, policy="most-free-memory", wait=True, timeout="5m")
lease

# %%
import torch  # after orch.use: torch sees exactly the leased device, as cuda:0

device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
x = torch.randn(256, 8, device=device)
y = x.sum(dim=1, keepdim=True)
model = torch.nn.Linear(8, 1).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
for step in range(100):
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"on {device}: loss {loss.item():.5f}")

# %%
# Done with the GPU but keeping the kernel: give it back.
lease.release()
print(lease)
