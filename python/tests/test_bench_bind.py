"""bench/torch_threads.py's --bind: the comparison scripts bind OpenMP's threads for
the whole run (torch in the script, the seqpack tool it starts) where the largest
thread count fills the CPUs, as the seqpack tool binds its own, and never over a
placement the environment sets."""
import json
import os
import subprocess
import sys

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")
SCRIPT = """
import json, os, sys
sys.path.insert(0, {bench!r})
from torch_threads import apply_bind
placement = apply_bind(sys.argv[1], [int(t) for t in sys.argv[2].split(",")])
print(json.dumps({{"placement": placement, "env": {{k: os.environ.get(k) for k in
    ("OMP_PROC_BIND", "OMP_PLACES", "SEQPACK_BIND_THREADS")}}}}))
"""
CLEAN = {k: v for k, v in os.environ.items()
         if k not in ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY",
                      "SEQPACK_BIND_THREADS")}
CPUS = len(os.sched_getaffinity(0))


def run(tmp_path, choice, threads, **env):
    script = tmp_path / "bind.py"
    script.write_text(SCRIPT.format(bench=BENCH))
    out = subprocess.run([sys.executable, str(script), choice, threads], env=dict(CLEAN, **env),
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def test_auto_binds_where_the_threads_fill_the_cpus(tmp_path):
    r = run(tmp_path, "auto", f"1,{CPUS}")
    assert r["env"] == {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores", "SEQPACK_BIND_THREADS": None}
    assert "OMP_PROC_BIND=close OMP_PLACES=cores" in r["placement"]


def test_auto_leaves_fewer_threads_unbound_and_tells_the_tool(tmp_path):
    if CPUS == 1:
        return  # one CPU: every count of at least one fills it
    r = run(tmp_path, "auto", "1")
    assert r["env"] == {"OMP_PROC_BIND": None, "OMP_PLACES": None, "SEQPACK_BIND_THREADS": "0"}
    assert f"1 threads at most, {CPUS} CPUs" in r["placement"]


def test_yes_and_no(tmp_path):
    assert run(tmp_path, "yes", "1")["env"]["OMP_PROC_BIND"] == "close"
    r = run(tmp_path, "no", str(CPUS))
    assert r["env"] == {"OMP_PROC_BIND": None, "OMP_PLACES": None, "SEQPACK_BIND_THREADS": "0"}


def test_the_environment_placement_is_kept(tmp_path):
    for choice in ("auto", "no"):
        r = run(tmp_path, choice, str(CPUS), OMP_PROC_BIND="spread")
        assert r["env"] == {"OMP_PROC_BIND": "spread", "OMP_PLACES": None, "SEQPACK_BIND_THREADS": None}
        assert r["placement"] == "threads placed by the environment (OMP_PROC_BIND=spread)"
