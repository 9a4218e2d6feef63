"""The thread-block cluster primitives of the CUDA code (cuda/src/cuda_compat.cuh:
launch_cluster, cluster_rank, cluster_blocks, cluster_sync, peer_shared,
spin_pause, atomic_add/atomic_load) through their CPU emulation
(cuda/emulate/cuda_emulate.h), by the probe kernel cuda/probe/cluster_probe.cu:
an all-gather through the cluster's shared memory every step, then a flag
barrier between clusters in global memory. Expected values from NumPy.

Needs no GPU: the probe is compiled with g++ against the emulation, as
test_cuda_glue.py compiles the library. nvcc compiles the same file for sm_80
and sm_90 in scripts/build_cuda.sh.
"""
import ctypes
import os
import shutil
import subprocess

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EPS32 = float(np.finfo(np.float32).eps)


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    if os.environ.get("SEQPACK_TEST_CUDA") == "0":
        pytest.skip("SEQPACK_TEST_CUDA=0: the CUDA kernels' CPU emulation is not run (scripts/test.sh)")
    cxx = next((shutil.which(c) for c in ("g++-12", "g++", "g++-14", "g++-13") if shutil.which(c)), None)
    if cxx is None:
        pytest.skip("no g++ to build the emulated probe")
    out = tmp_path_factory.mktemp("cluster") / "libseqpack_cuda_probe.so"
    subprocess.run([cxx, "-std=c++20", "-O1", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror",
                    "-Wno-unknown-pragmas", "-x", "c++", os.path.join(ROOT, "cuda", "probe", "cluster_probe.cu"),
                    "-DSEQPACK_CUDA_EMULATE", "-I", os.path.join(ROOT, "cuda", "emulate"),
                    "-I", os.path.join(ROOT, "include"), "-o", str(out)], check=True)
    lib = ctypes.CDLL(str(out))
    f = lib.seqpack_cuda_probe_cluster_allgather
    p = ctypes.c_void_p
    f.argtypes = [p, p, p, p, p, ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, p]
    f.restype = ctypes.c_int
    return f


def _run(probe, cluster, clusters, width, threads, steps, seed):
    rng = np.random.default_rng(seed)
    blocks = cluster * clusters
    x = rng.uniform(-1, 1, (blocks, width)).astype(np.float32)
    gathered = np.full((steps, blocks, cluster * width), np.nan, np.float32)
    sums = np.full((steps, clusters), np.nan, np.float32)
    totals = np.full((steps, clusters), np.nan, np.float32)
    arrivals = np.zeros(1, np.uint32)
    status = probe(x.ctypes.data, gathered.ctypes.data, sums.ctypes.data, totals.ctypes.data,
                   arrivals.ctypes.data, width, cluster, clusters, steps, threads, None)
    return status, x, gathered, sums, totals, arrivals


@pytest.mark.parametrize("cluster,clusters,width,threads", [
    (1, 1, 5, 4), (2, 1, 7, 3), (4, 3, 37, 8), (16, 2, 9, 32), (3, 4, 1, 2)])
def test_allgather_through_cluster_shared_memory_and_a_flag_barrier(probe, cluster, clusters, width, threads):
    steps = 3
    status, x, gathered, sums, totals, arrivals = _run(probe, cluster, clusters, width, threads, steps,
                                                       cluster * 100 + clusters)
    assert status == 0
    for step in range(steps):
        for c in range(clusters):
            # Every block of cluster c holds the slices of all of them, in rank order.
            want = (x[c * cluster:(c + 1) * cluster] * np.float32(step + 1)).reshape(-1)
            for r in range(cluster):
                np.testing.assert_array_equal(gathered[step, c * cluster + r], want,
                                              err_msg=f"step {step}, cluster {c}, rank {r}")
            exact = want.astype(np.float64).sum()
            bound = len(want) * EPS32 * np.abs(want.astype(np.float64)).sum()
            assert abs(float(sums[step, c]) - exact) <= bound, (step, c, sums[step, c], exact)
        # Each cluster read every cluster's sum of this step: the flag barrier held.
        exact = sums[step].astype(np.float64).sum()
        bound = clusters * EPS32 * np.abs(sums[step].astype(np.float64)).sum()
        for c in range(clusters):
            assert abs(float(totals[step, c]) - exact) <= bound, (step, c, totals[step], sums[step])
    assert int(arrivals[0]) == steps * clusters


def test_bad_sizes_are_refused_before_a_launch(probe):
    for cluster, clusters, width, threads in [(0, 1, 4, 4), (2, 0, 4, 4), (2, 1, 0, 4), (2, 1, 4, 0)]:
        arrivals = np.zeros(1, np.uint32)
        buf = np.zeros(64, np.float32)
        status = probe(buf.ctypes.data, buf.ctypes.data, buf.ctypes.data, buf.ctypes.data, arrivals.ctypes.data,
                       width, cluster, clusters, 1, threads, None)
        assert status != 0, (cluster, clusters, width, threads)
        assert int(arrivals[0]) == 0
