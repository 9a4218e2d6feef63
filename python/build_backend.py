"""seqpack's PEP 517 build backend: in-tree (pyproject.toml's backend-path),
standard library only, so `pip wheel --no-build-isolation .` needs nothing
from a package index: CMake and a compiler build, this file zips.

build_wheel configures and builds only what the package holds (the library,
the Python extension seqpack._seqpack, the command-line tool `seqpack` and,
unless SEQPACK_WHEEL_TORCH=OFF, the operator library libseqpack_torch.so; no
tests, examples or benchmarks) in one CMake run out of the source tree: in a
temporary directory removed afterwards, or in SEQPACK_WHEEL_BUILD_DIR (config
setting build-dir), kept and reused by the next build. It then writes a wheel
of python/seqpack/*.py and the shared objects, tagged for the interpreter that
runs it, with the tool as a script (seqpack-<version>.data/scripts/seqpack,
which pip installs as V/bin/seqpack). The tool links the seqpack libraries
statically, so it needs no RPATH: its shared libraries are the system's
(OpenBLAS, oneDNN, Highway, ONNX, protobuf, fmt), as for ./build/seqpack.
The extension is for that interpreter and libseqpack_torch for the LibTorch that find_package(Torch)
finds (Debian's libtorch-dev, the same libtorch_cpu.so that python3-torch
loads). The version is CMake's project(seqpack VERSION ...), as everywhere.

Progress: a line per stage and CMake's own output go to stderr, which pip
shows with -v (without it pip shows a spinner, and the output if the build
fails). Extra CMake arguments: SEQPACK_CMAKE_ARGS or the config setting
cmake-args (`pip wheel --config-settings cmake-args="-DX=Y -DZ=W"`), split as a shell would;
CMAKE_C_COMPILER_LAUNCHER / CMAKE_CXX_COMPILER_LAUNCHER in the environment
(e.g. ccache) are passed on to CMake.
"""
import base64
import csv
import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "seqpack"


def _version():
    """CMake's project(seqpack VERSION x.y.z), the one version of the project."""
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        m = re.search(r"project\(\s*seqpack\s+VERSION\s+(\d+\.\d+\.\d+)", f.read())
    if not m:
        raise ValueError(f"{os.path.join(ROOT, 'CMakeLists.txt')}: no project(seqpack VERSION x.y.z)")
    return m.group(1)


def _tag():
    impl = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{impl}-{impl}-{platform}"


def _metadata():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {_version()}\n"
            "Summary: Batching of variable-length sequences and RNN/LSTM/GRU layers that spend "
            "no compute on padding, with PyTorch 1.13's semantics\n"
            "Requires-Python: >=3.9\nRequires-Dist: numpy\n"
            "Description-Content-Type: text/markdown\n\n" + readme)


def _wheel_file():
    return (f"Wheel-Version: 1.0\nGenerator: seqpack build_backend\nRoot-Is-Purelib: false\n"
            f"Tag: {_tag()}\n")


def _dist_info():
    return f"{NAME}-{_version()}.dist-info"


def _say(message):
    print(f"seqpack build_backend: {message}", file=sys.stderr, flush=True)


def _cmake_args(settings):
    """Extra CMake arguments: compiler launchers from the environment, then
    SEQPACK_CMAKE_ARGS, then the config setting cmake-args (later ones win)."""
    args = [f"-D{var}={os.environ[var]}"
            for var in ("CMAKE_C_COMPILER_LAUNCHER", "CMAKE_CXX_COMPILER_LAUNCHER")
            if os.environ.get(var)]
    args += shlex.split(os.environ.get("SEQPACK_CMAKE_ARGS", ""))
    extra = settings.get("cmake-args") or []
    for item in [extra] if isinstance(extra, str) else extra:  # given once or repeated
        args += shlex.split(item)
    return args


def _build(config_settings, build_dir):
    settings = config_settings or {}
    torch = (settings.get("torch") or os.environ.get("SEQPACK_WHEEL_TORCH", "ON")).upper()
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
    configure = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                 "-DSEQPACK_BUILD_TESTS=OFF", "-DSEQPACK_BUILD_CLI=ON",
                 "-DSEQPACK_BUILD_EXAMPLES=OFF", "-DSEQPACK_BUILD_BENCHMARKS=OFF",
                 "-DSEQPACK_BUILD_PYTHON=ON", f"-DSEQPACK_BUILD_TORCH={torch}",
                 # pybind11 would link the bindings with LTO: slower to build,
                 # nothing to gain in thin bindings.
                 "-DCMAKE_INTERPROCEDURAL_OPTIMIZATION=OFF",
                 f"-DPython3_EXECUTABLE={sys.executable}", *_cmake_args(settings)]
    # seqpack_cli is the tool (its OUTPUT_NAME is seqpack).
    targets = ["seqpack_python", "seqpack_cli"] + (["seqpack_torch"] if torch == "ON" else [])
    build = ["cmake", "--build", build_dir, "-j", jobs, "--target", *targets]
    for step, (what, cmd) in enumerate((("configuring", configure),
                                        (f"building {', '.join(targets)}", build)), 1):
        _say(f"[{step}/3] {what}: {' '.join(shlex.quote(c) for c in cmd)}")
        start = time.monotonic()
        subprocess.run(cmd, check=True, stdout=sys.stderr)
        _say(f"[{step}/3] {what}: done in {time.monotonic() - start:.0f} s")
    package = os.path.join(build_dir, "python", NAME)
    files = sorted(f for f in os.listdir(package)
                   if f.endswith(".py") or f.endswith(".so"))
    entries = []
    for f in files:
        with open(os.path.join(package, f), "rb") as data:  # follows the build tree's symlinks
            entries.append((f"{NAME}/{f}", data.read(), 0o755 if f.endswith(".so") else 0o644))
    # The tool, as a script of the wheel: pip installs it into the
    # environment's bin/ with its mode (no #!python line: copied as it is).
    with open(os.path.join(build_dir, NAME), "rb") as tool:
        entries.append((f"{NAME}-{_version()}.data/scripts/{NAME}", tool.read(), 0o755))
    return entries


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [arcname, f"sha256={digest}", str(len(data))]


# ---- PEP 517 hooks ----------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    path = os.path.join(metadata_directory, _dist_info())
    os.makedirs(path, exist_ok=True)
    for name, text in (("METADATA", _metadata()), ("WHEEL", _wheel_file())):
        with open(os.path.join(path, name), "w") as f:
            f.write(text)
    return _dist_info()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    settings = config_settings or {}
    build_dir = settings.get("build-dir") or os.environ.get("SEQPACK_WHEEL_BUILD_DIR")
    if build_dir:
        entries = _build(settings, os.path.abspath(build_dir))
    else:
        temp = tempfile.mkdtemp(prefix="seqpack-wheel-")
        try:
            entries = _build(settings, temp)
        finally:
            shutil.rmtree(temp, ignore_errors=True)
    dist_info = _dist_info()
    entries.append((f"{dist_info}/METADATA", _metadata().encode(), 0o644))
    entries.append((f"{dist_info}/WHEEL", _wheel_file().encode(), 0o644))
    entries.append((f"{dist_info}/top_level.txt", f"{NAME}\n".encode(), 0o644))
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for arcname, data, _ in entries:
        writer.writerow(_record_line(arcname, data))
    writer.writerow([f"{dist_info}/RECORD", "", ""])
    entries.append((f"{dist_info}/RECORD", record.getvalue().encode(), 0o644))

    filename = f"{NAME}-{_version()}-{_tag()}.whl"
    _say(f"[3/3] writing {filename}")
    os.makedirs(wheel_directory, exist_ok=True)
    with zipfile.ZipFile(os.path.join(wheel_directory, filename), "w",
                         zipfile.ZIP_DEFLATED) as wheel:
        for arcname, data, mode in entries:
            info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
    return filename
