"""Whether torch.compile's CPU backend will find a C++ compiler here. Stdlib only.

Inductor (torch/_inductor/cpp_builder.py, `cpp_compiler_search`) tries `$CXX` if set, else `g++`
(`clang++` on macOS), and takes the first that answers `--version`; without one the first compiled
step fails deep inside torch. `mt launch` and the engine ask the same question here, before step 1.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys


def cxx_problem() -> str | None:
    """Why inductor would find no C++ compiler (None when it would), as one line."""
    default = "clang++" if sys.platform == "darwin" else "g++"
    cxx = os.environ.get("CXX", default)  # as inductor's config reads it: CXX="" is no compiler
    where = f"CXX={cxx!r}" if "CXX" in os.environ else f"{default} (CXX is not set)"
    path = shutil.which(cxx) if cxx else None
    if path is None:
        missing = "is no executable file" if os.sep in cxx else "is not found on PATH"
        return f"torch.compile on CPU needs a C++ compiler and {where} {missing}; install one (apt-get install g++) or set CXX"
    try:
        subprocess.run([path, "--version"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as e:
        return f"torch.compile on CPU needs a C++ compiler and {where} ({path}) does not run: {e}"
    return None
