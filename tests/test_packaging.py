"""Packaging, as a user meets it: `cmake --install` (header, library, CMake package,
kbit.pc) and the example consumer built with find_package, pkg-config and
add_subdirectory; the Python wheel and sdist (scikit-build-core) and `pip install` of the
wheel into a fresh virtual environment, used from another directory.

Everything is built CPU-only here (the GPU build is the same CMake with nvcc found, and
takes minutes); each build happens once per test session."""
import email
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

from conftest import ROOT

CONSUMER = os.path.join(ROOT, "examples", "c-consumer")
cmake = shutil.which("cmake")
pytestmark = pytest.mark.skipif(cmake is None, reason="cmake is not installed")
GENERATOR = ["-G", "Ninja"] if shutil.which("ninja") else []


def sh(*cmd, cwd=None, env=None, timeout=900):
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def header_version():
    text = open(os.path.join(ROOT, "include", "kbit.h")).read()
    parts = [re.search(rf"#define KBIT_VERSION_{p} (\d+)", text).group(1)
             for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    """kbit built CPU-only and installed into a fresh prefix."""
    tmp = tmp_path_factory.mktemp("install")
    build, prefix = tmp / "build", tmp / "prefix"
    # KBIT_COPY_TO_PYTHON=OFF: this CPU-only build must not replace the library the rest
    # of the test run loads from bindings/python/kbit
    sh(cmake, "-S", ROOT, "-B", build, *GENERATOR, "-DKBIT_ENABLE_CUDA=OFF",
       "-DKBIT_COPY_TO_PYTHON=OFF", "-DCMAKE_BUILD_TYPE=Release")
    sh(cmake, "--build", build, "-j", "2")
    sh(cmake, "--install", build, "--prefix", prefix)
    return prefix


def run_consumer(path):
    out = sh(path)
    assert re.match(r"kbit \d+: K=4 SQNR \d+\.\d+ dB", out), out
    return out


def test_install_tree(prefix):
    version = header_version()
    libdir = next(d for d in ("lib", "lib64") if (prefix / d / "libkbit.so").exists())
    for rel in ("include/kbit.h", f"{libdir}/libkbit.so", f"{libdir}/libkbit.so.{version}",
                f"{libdir}/cmake/kbit/kbitConfig.cmake",
                f"{libdir}/cmake/kbit/kbitConfigVersion.cmake", f"{libdir}/pkgconfig/kbit.pc"):
        assert (prefix / rel).exists(), rel
    dynamic = sh("objdump", "-p", prefix / libdir / "libkbit.so") if shutil.which("objdump") \
        else ""
    if dynamic:
        assert re.search(r"SONAME\s+libkbit\.so\.0\b", dynamic), dynamic
    pc = (prefix / libdir / "pkgconfig" / "kbit.pc").read_text()
    assert f"Version: {version}" in pc
    # nothing of the build or the tests is installed
    assert not list(prefix.rglob("test_c_*")) and not list(prefix.rglob("kbit_bench"))


def test_consumer_find_package(prefix, tmp_path):
    build = tmp_path / "build"
    sh(cmake, "-S", CONSUMER, "-B", build, *GENERATOR, f"-DCMAKE_PREFIX_PATH={prefix}")
    sh(cmake, "--build", build)
    run_consumer(build / "consumer")


@pytest.mark.skipif(shutil.which("pkg-config") is None, reason="pkg-config is not installed")
def test_consumer_pkg_config(prefix, tmp_path):
    libdir = next(d for d in ("lib", "lib64") if (prefix / d).exists())
    env = dict(os.environ, PKG_CONFIG_PATH=str(prefix / libdir / "pkgconfig"))
    work = tmp_path / "src"
    shutil.copytree(CONSUMER, work)
    sh("make", "-C", work, env=env)
    run_consumer(work / "consumer")
    # the prefix found by kbit.pc is the install prefix, wherever that is
    assert sh("pkg-config", "--variable=includedir", "kbit", env=env).strip() and \
        os.path.samefile(sh("pkg-config", "--variable=includedir", "kbit", env=env).strip(),
                         prefix / "include")


def test_consumer_add_subdirectory(tmp_path):
    build = tmp_path / "build"
    lib = os.path.join(ROOT, "bindings", "python", "kbit", "libkbit.so")
    before = os.stat(lib).st_mtime_ns if os.path.exists(lib) else None
    sh(cmake, "-S", CONSUMER, "-B", build, *GENERATOR, f"-DKBIT_SOURCE_DIR={ROOT}",
       "-DKBIT_ENABLE_CUDA=OFF", "-DKBIT_COPY_TO_PYTHON=ON")
    sh(cmake, "--build", build, "-j", "2")
    run_consumer(build / "consumer")
    # as a subproject kbit builds no tests and leaves the Python package folder alone,
    # even when asked to copy
    assert not list(build.rglob("test_c_link"))
    assert (os.stat(lib).st_mtime_ns if os.path.exists(lib) else None) == before


# -- Python ------------------------------------------------------------------------------
def _have_build_backend():
    try:
        import scikit_build_core  # noqa: F401
        return True
    except ImportError:
        return False


requires_backend = pytest.mark.skipif(not _have_build_backend(),
                                      reason="scikit-build-core is not installed")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    sh(sys.executable, "-m", "pip", "wheel", ROOT, "--no-build-isolation", "--no-deps",
       "-w", out, "-C", "cmake.define.KBIT_ENABLE_CUDA=OFF",
       "-C", f"build-dir={out / 'build'}")
    (path,) = out.glob("kbit-*.whl")
    return path


@requires_backend
def test_wheel(wheel):
    version = header_version()
    # a platform wheel (it carries a native library) usable by every Python 3
    assert re.fullmatch(rf"kbit-{re.escape(version)}-py3-none-linux_\w+\.whl", wheel.name), \
        wheel.name
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = email.message_from_bytes(z.read(f"kbit-{version}.dist-info/METADATA"))
        entry_points = z.read(f"kbit-{version}.dist-info/entry_points.txt").decode()
    assert "kbit/libkbit.so" in names and "kbit/cli.py" in names
    assert "kbit/reference/kbit.py" in names
    assert any(n.endswith("LICENSE") for n in names)
    assert meta["Name"] == "kbit" and meta["Version"] == version
    assert "MIT" in (meta.get("License", "") + meta.get("License-Expression", "")
                     + " ".join(meta.get_all("Classifier", [])))
    assert "kbit = kbit.cli:main" in entry_points


@requires_backend
def test_sdist_has_every_source(tmp_path):
    out = tmp_path / "sdist"
    code = ("import sys; from scikit_build_core.build import build_sdist; "
            "print(build_sdist(sys.argv[1]))")
    name = sh(sys.executable, "-c", code, out, cwd=ROOT).strip().splitlines()[-1]
    with tarfile.open(out / name) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    tracked = sh("git", "ls-files", cwd=ROOT).split() if shutil.which("git") and \
        os.path.isdir(os.path.join(ROOT, ".git")) else []
    needed = [f for f in tracked if f.startswith(("csrc/", "include/", "cmake/",
                                                  "bindings/python/kbit/"))]
    needed += ["CMakeLists.txt", "pyproject.toml", "LICENSE", "README.md"]
    missing = [f for f in needed if f not in names]
    assert not missing, missing[:10]
    assert not any(n.endswith("libkbit.so") for n in names)


@requires_backend
def test_pip_install_into_fresh_venv(wheel, tmp_path):
    """The wheel in a new virtual environment (numpy from this interpreter's packages,
    nothing downloaded), then the README's example from another directory, and the CLI."""
    import numpy
    venv = tmp_path / "venv"
    sh(sys.executable, "-m", "venv", venv)
    py = venv / "bin" / "python"
    # numpy from this interpreter's packages (wherever they are: system, user or another
    # virtual environment), by a .pth file; kbit itself only from the wheel
    purelib = sh(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
    with open(os.path.join(purelib, "test-deps.pth"), "w") as f:
        f.write(os.path.dirname(os.path.dirname(numpy.__file__)) + "\n")
    sh(py, "-m", "pip", "install", "--no-index", "--no-deps", "-q", wheel)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KBIT_LIBRARY")}
    code = ("import numpy as np, kbit, os; "
            "w = np.random.default_rng(0).standard_normal((256, 512)).astype(np.float32); "
            "q = kbit.quantize(w, k=4); y = kbit.dequantize(q); "
            "x = np.ones((2, 512), np.float32); z = kbit.matmul(x, q); "
            "assert z.shape == (2, 256); "
            "print(kbit.__version__, os.path.dirname(kbit.__file__), q.bits_per_element)")
    out = sh(py, "-c", code, cwd=elsewhere, env=env)
    version, where, bits = out.split()
    assert version == header_version() and float(bits) == 4.25
    assert str(venv) in where  # the installed package, not the source tree
    help_text = sh(venv / "bin" / "kbit", "--help", cwd=elsewhere, env=env)
    assert "quantize" in help_text and "report" in help_text
