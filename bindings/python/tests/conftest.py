"""Shared fixtures: one libpccl.so per test session (or $CONCORD_LIB), and child processes that are
always reaped."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

HERE = pathlib.Path(__file__).resolve().parent
PKG_ROOT = HERE.parent  # bindings/python: the directory that holds the concord package
sys.path.insert(0, str(PKG_ROOT))


def pytest_configure(config):
    """Builds the library once (unless CONCORD_LIB names one) and exports its path, so that the
    package in this process and in every child process loads the same file."""
    if os.environ.get("CONCORD_LIB"):
        return
    from concord import _lib

    out = pathlib.Path(tempfile.mkdtemp(prefix="concord-lib-")) / _lib.LIB_NAME
    config._concord_lib_dir = out.parent
    _lib.build(out)
    os.environ["CONCORD_LIB"] = str(out)


def pytest_unconfigure(config):
    d = getattr(config, "_concord_lib_dir", None)
    if d is not None:
        shutil.rmtree(d, ignore_errors=True)


class Children:
    """Child processes started by one test; every one still running at the end is killed by pid."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []

    def python(self, script: pathlib.Path | str, *args: str, env: dict | None = None) -> subprocess.Popen:
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = str(PKG_ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
        full_env.update(env or {})
        p = subprocess.Popen([sys.executable, "-u", str(script), *args], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=full_env)
        self.procs.append(p)
        return p

    def cleanup(self):
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()


@pytest.fixture
def children():
    c = Children()
    yield c
    c.cleanup()
