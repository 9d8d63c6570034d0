"""Where a number came from: machine, versions and commit, stamped on every result and benchmark."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import torch


def package_version() -> str:
    """This package's version: its installed metadata's, else ``boltzmann_attention.__version__`` (a source tree
    on the path that was never installed)."""
    from importlib import metadata

    try:
        return metadata.version("boltzmann-attention")
    except metadata.PackageNotFoundError:
        from . import __version__

        return __version__


def git_commit() -> str:
    """Short hash of the checkout this package runs from, with '-dirty' if tracked files are modified."""
    here = Path(__file__).parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=True, cwd=here).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True, cwd=here).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("-dirty" if status else "")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def machine_info() -> dict:
    return {"machine": platform.machine(), "processor": cpu_name(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "python": platform.python_version(), "commit": git_commit()}
