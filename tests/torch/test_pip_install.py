#!/usr/bin/python3
"""`pip install .` of commpact_hooks, offline, into a fresh virtual environment.

Creates a venv with --system-site-packages (it sees Debian's torch) in a temporary
folder, installs the repository into it with `pip install --no-build-isolation
--no-index` (setup.py: torch.utils.cpp_extension; nothing is downloaded), checks that the
module landed in the venv's site-packages, and runs tests/torch/pip_smoke.py from the
temporary folder (outside the source tree) with the venv's Python: two DDP ranks over
Gloo with gtopk_hook, replicas identical and the loss falling.
The intermediate build files go to the temporary folder (COMMPACT_HOOKS_BUILD_DIR), so
the source tree is left as it was; MAX_JOBS=1 keeps the compile to one job.
Run: /usr/bin/python3 tests/torch/test_pip_install.py
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(cmd, **kw):
    t0 = time.monotonic()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    print(f"$ {' '.join(cmd)}  ({time.monotonic() - t0:.1f} s)")
    if r.returncode != 0:
        print(r.stdout[-8000:])
        raise SystemExit(f"test_pip_install: the command above failed with exit code {r.returncode}")
    return r.stdout


def main():
    with tempfile.TemporaryDirectory(prefix="commpact-pip-") as tmp:
        # A venv that cannot see the system's torch: setup.py must say so, not only that
        # torch is missing (made without pip: setup.py checks torch before setuptools).
        bare = os.path.join(tmp, "bare")
        run([sys.executable, "-m", "venv", "--without-pip", bare])
        r = subprocess.run([os.path.join(bare, "bin", "python"), os.path.join(SRC, "setup.py"), "--version"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp,
                           env=dict(os.environ, PYTHONNOUSERSITE="1", PYTHONPATH=""))
        if r.returncode == 0 or "without the system's site packages" not in r.stdout:
            raise SystemExit(f"test_pip_install: setup.py in a venv without system site packages exited "
                             f"{r.returncode} with: {r.stdout[-2000:]}")
        venv = os.path.join(tmp, "venv")
        run([sys.executable, "-m", "venv", "--system-site-packages", venv])
        py = os.path.join(venv, "bin", "python")
        env = dict(os.environ, MAX_JOBS="1", COMMPACT_HOOKS_BUILD_DIR=os.path.join(tmp, "build"),
                   PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONNOUSERSITE="1")
        env.pop("PYTHONPATH", None)
        run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index", SRC], env=env, cwd=tmp)
        site = run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"], env=env, cwd=tmp).strip()
        if not any(f.startswith("commpact_hooks") and f.endswith(".so") for f in os.listdir(site)):
            raise SystemExit(f"test_pip_install: no commpact_hooks module in {site}: {sorted(os.listdir(site))}")
        shutil.copy(os.path.join(SRC, "tests", "torch", "pip_smoke.py"), tmp)
        print(run([py, os.path.join(tmp, "pip_smoke.py"), site], env=dict(env, OMP_NUM_THREADS="1"), cwd=tmp))
    print("test_pip_install: passed")


if __name__ == "__main__":
    main()
