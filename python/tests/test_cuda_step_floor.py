"""cuda/probe/step_floor.cu (the per-step floor of a persistent recurrence on
thread-block clusters: W_hh slices in shared memory, h all-gathered through
distributed shared memory, one cluster barrier a step) through the CPU
emulation, against a float64 recurrence (step_floor_check.py). The GPU runs
and times it in bench/cuda_step_floor.py (scripts/device_check.sh)."""
import ctypes
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from helpers import build_emulated_cuda  # noqa: E402
from step_floor_check import bind, check_floor, make_case, run_floor  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def floor(tmp_path_factory):
    out = tmp_path_factory.mktemp("floor") / "libseqpack_cuda_probe.so"
    build_emulated_cuda(os.path.join("cuda", "probe", "step_floor.cu"), out)
    return str(out)


# (hidden, batch, steps, cluster, threads): one or many outputs a thread,
# products split over 1 to 32 threads, clusters of 1 to 16 blocks.
CASES = [(8, 1, 3, 1, 32), (12, 2, 4, 4, 32), (16, 3, 5, 16, 64), (40, 1, 6, 8, 64), (32, 5, 3, 2, 32)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden,batch,steps,cluster,threads", CASES)
def test_step_floor_kernel_is_the_recurrence(floor, dtype, hidden, batch, steps, cluster, threads):
    w, xg, h0 = make_case(hidden, batch, steps, dtype, hidden * 31 + batch, CPU)
    status, y = run_floor(bind(ctypes.CDLL(floor)), w, xg, h0, cluster, threads)
    assert status == 0
    check_floor(w, xg, h0, y)


def test_step_floor_kernel_refuses_sizes_it_does_not_take(floor):
    floor = bind(ctypes.CDLL(floor))
    w, xg, h0 = make_case(12, 2, 2, torch.float32, 1, CPU)
    for cluster, threads in [(5, 32), (0, 32), (4, 0), (4, 48), (4, 2048)]:  # 12 % 5 != 0, ...
        status, y = run_floor(floor, w, xg, h0, cluster, threads)
        assert status == 1, (cluster, threads)
        assert torch.isnan(y).all(), "a refused call wrote its output"
    w16 = w.to(torch.float16)  # dtype 1, float16: not a type the kernel takes
    y = torch.full((2, 2, 12), float("nan"))
    assert floor(1, w16.data_ptr(), xg.data_ptr(), h0.data_ptr(), y.data_ptr(), 12, 2, 2, 4, 32, None) == 1


def test_the_benchmark_runs_its_checks_and_writes_its_table(floor, tmp_path):
    """bench/cuda_step_floor.py's own code paths (the GPU run is the device
    check's), on the emulated library with tiny sizes: every configuration
    checked and timed, one the kernel refuses reported, the JSON written."""
    out = tmp_path / "floor.json"
    run = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "cuda_step_floor.py"),
                          "--self-test-library", floor, "--hidden", "16,24", "--batch", "2", "--clusters", "4,5",
                          "--threads", "32", "--steps", "2,4", "--repeats", "1", "--json", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    import json
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 * 2 * 2
    for r in rows:
        if r["hidden"] % r["cluster"] == 0:
            assert "us_per_step" in r and r["error"] <= r["bound"], r
        else:  # 16 or 24 hidden units over 5 blocks: refused, reported
            assert r["error_message"] == "CUDA error 1" and not r["wrong"], r
    assert "| bf16 | 16 | 2 | 4 |" in run.stdout
