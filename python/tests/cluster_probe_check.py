"""The expected results of cuda/probe/cluster_probe.cu, shared by its CPU run
through the emulation (test_cuda_cluster.py) and its GPU run (test_cuda_gpu.py).

run_probe(f, device, ...) runs seqpack_cuda_probe_cluster_allgather (the ctypes
function f) on tensors of `device` and check_probe(...) compares its outputs
with their meaning: every block of a cluster holds the slices of all of them
in rank order, block 0's sum of them within float32's bound of the exact sum,
and each cluster's total of every cluster's sums (read after the flag barrier)
within the bound of the sums' exact total."""
import ctypes

import torch

EPS32 = torch.finfo(torch.float32).eps

ARGTYPES = [ctypes.c_void_p] * 5 + [ctypes.c_int64] + [ctypes.c_int] * 4 + [ctypes.c_void_p]


def bind(lib):
    f = lib.seqpack_cuda_probe_cluster_allgather
    f.argtypes = ARGTYPES
    f.restype = ctypes.c_int
    return f


def run_probe(f, device, cluster, clusters, width, threads, steps, seed, stream=None):
    """(status, x, gathered, sums, totals, arrivals), all on the CPU."""
    g = torch.Generator().manual_seed(seed)
    blocks = cluster * clusters
    x = (torch.rand(blocks, width, generator=g) * 2 - 1).to(device)
    gathered = torch.full((steps, blocks, cluster * width), float("nan"), device=device)
    sums = torch.full((steps, clusters), float("nan"), device=device)
    totals = torch.full((steps, clusters), float("nan"), device=device)
    arrivals = torch.zeros(1, dtype=torch.int32, device=device)
    status = f(x.data_ptr(), gathered.data_ptr(), sums.data_ptr(), totals.data_ptr(), arrivals.data_ptr(),
               width, cluster, clusters, steps, threads, stream)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return status, x.cpu(), gathered.cpu(), sums.cpu(), totals.cpu(), arrivals.cpu()


def check_probe(cluster, clusters, steps, x, gathered, sums, totals, arrivals):
    for step in range(steps):
        for c in range(clusters):
            want = (x[c * cluster:(c + 1) * cluster] * float(step + 1)).reshape(-1)
            for r in range(cluster):
                got = gathered[step, c * cluster + r]
                assert torch.equal(got, want), f"step {step}, cluster {c}, rank {r}: gathered {got} != {want}"
            exact = want.double().sum().item()
            bound = want.numel() * EPS32 * want.double().abs().sum().item()
            assert abs(sums[step, c].item() - exact) <= bound, (step, c, sums[step, c].item(), exact)
        exact = sums[step].double().sum().item()
        bound = clusters * EPS32 * sums[step].double().abs().sum().item()
        for c in range(clusters):
            assert abs(totals[step, c].item() - exact) <= bound, (step, c, totals[step].tolist(), sums[step].tolist())
    assert int(arrivals[0]) == steps * clusters, int(arrivals[0])
