"""bench/torch_threads.py's choice of OPENBLAS_CORETYPE for the torch peer: only
where OpenBLAS fell back to a generic pre-AVX kernel set on a CPU with AVX2 or
AVX-512 (Debian 12's OpenBLAS 0.3.21 shows Prescott on AMX Xeons), never over
a choice OpenBLAS made itself."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))

from torch_threads import openblas_core_to_name, openblas_corename  # noqa: E402


def test_generic_core_on_avx512_cpu_names_skylakex():
    assert openblas_core_to_name("Prescott", {"sse3", "avx2", "avx512f", "amx_tile"}) == "SkylakeX"


def test_generic_core_on_avx2_cpu_names_haswell():
    assert openblas_core_to_name("Prescott", {"sse3", "avx", "avx2"}) == "Haswell"


def test_own_choice_stands():
    assert openblas_core_to_name("SkylakeX", {"avx512f"}) is None
    assert openblas_core_to_name("Zen", {"avx2", "avx512f"}) is None
    assert openblas_core_to_name("Cooperlake", {"avx512f", "avx512_bf16"}) is None


def test_generic_core_on_old_cpu_stands():
    assert openblas_core_to_name("Prescott", {"sse3", "ssse3"}) is None


def test_no_openblas():
    assert openblas_core_to_name(None, {"avx512f"}) is None


def test_corename_reads_the_loaded_library():
    import torch  # noqa: F401  Debian's torch loads the system OpenBLAS
    with open("/proc/self/maps") as f:
        loaded = any("openblas" in line for line in f)
    name = openblas_corename()
    if loaded:
        assert isinstance(name, str) and name, "OpenBLAS is loaded but gave no core name"
    else:
        assert name is None
