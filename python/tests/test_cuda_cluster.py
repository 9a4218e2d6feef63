"""The thread-block cluster primitives of the CUDA code (cuda/src/cuda_compat.cuh:
launch_cluster, cluster_rank, cluster_blocks, cluster_sync, peer_shared,
spin_pause, atomic_add/atomic_load) through their CPU emulation
(cuda/emulate/cuda_emulate.h), by the probe kernel cuda/probe/cluster_probe.cu:
an all-gather through the cluster's shared memory every step, then a flag
barrier between clusters in global memory (cluster_probe_check.py says what
the results mean; test_cuda_gpu.py runs the same probe on a GPU).

Needs no GPU: the probe is compiled with g++ against the emulation, as
test_cuda_library.py compiles the library. nvcc compiles the same file for sm_80
and sm_90 in scripts/build_cuda.sh.
"""
import ctypes
import os
import sys

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from helpers import build_emulated_cuda  # noqa: E402
from cluster_probe_check import bind, check_probe, run_probe  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    out = tmp_path_factory.mktemp("cluster") / "libseqpack_cuda_probe.so"
    build_emulated_cuda(os.path.join("cuda", "probe", "cluster_probe.cu"), out)
    return bind(ctypes.CDLL(str(out)))


@pytest.mark.parametrize("cluster,clusters,width,threads", [
    (1, 1, 5, 4), (2, 1, 7, 3), (4, 3, 37, 8), (16, 2, 9, 32), (3, 4, 1, 2)])
def test_allgather_through_cluster_shared_memory_and_a_flag_barrier(probe, cluster, clusters, width, threads):
    steps = 3
    status, *results = run_probe(probe, CPU, cluster, clusters, width, threads, steps, cluster * 100 + clusters)
    assert status == 0
    check_probe(cluster, clusters, steps, *results)


def test_bad_sizes_are_refused_before_a_launch(probe):
    for cluster, clusters, width, threads in [(0, 1, 4, 4), (2, 0, 4, 4), (2, 1, 0, 4), (2, 1, 4, 0)]:
        arrivals = torch.zeros(1, dtype=torch.int32)
        buf = torch.zeros(64)
        p = buf.data_ptr()
        status = probe(p, p, p, p, arrivals.data_ptr(), width, cluster, clusters, 1, threads, None)
        assert status != 0, (cluster, clusters, width, threads)
        assert int(arrivals[0]) == 0
