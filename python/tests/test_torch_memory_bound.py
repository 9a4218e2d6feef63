"""Every cache a call fills is bounded (issue 59): seqpack.torch.LSTM(8, 16)
trained on random batch sizes and lengths (a new shape at nearly every call)
stops growing after its first thousand calls. bench/memory_growth.py is the
measurement (20,000 calls in docs/performance.md); this runs a shorter one in
a fresh process. Unbounded, oneDNN's primitives alone grew the process by
about 1 GB of address space per 1,000 calls."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_memory_stops_growing_after_the_first_thousand_calls():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "memory_growth.py"),
                        "--calls", "3000", "--baseline-call", "1000", "--check"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    grown = json.loads(r.stdout)["growth_after_baseline_mb"]
    assert grown["rss"] <= 64 and grown["vm"] <= 512, grown


OOM_SCRIPT = r"""
import resource, sys, torch
import seqpack.torch as st
m = st.LSTM(8, 256)
x = torch.randn(2000, 128, 8)
with torch.no_grad():
    m(x[:2])  # everything loaded and made
    used = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (used + (128 << 20), resource.RLIM_INFINITY))
    try:
        m(x)  # its output alone is 262 MB
    except Exception as e:  # noqa: BLE001
        print(type(e).__name__, "|", isinstance(e, RuntimeError), "|", e)
        sys.exit(0)
print("no error")
"""


def test_running_out_of_memory_is_memory_error():
    """A layer whose result cannot be allocated raises MemoryError with the
    core's message (docs/errors.md), not a crash."""
    r = subprocess.run([sys.executable, "-c", OOM_SCRIPT], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    name, _, message = r.stdout.strip().partition(" | ")
    assert name == "MemoryError", r.stdout
    assert "out of memory" in message and "cannot allocate" in message, r.stdout
