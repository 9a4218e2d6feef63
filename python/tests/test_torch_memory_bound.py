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
