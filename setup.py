"""Only for a binary wheel that ships the CPU kernels compiled (everything else is in pyproject.toml):

    SPECLENS_PREBUILD_KERNELS=1 pip wheel --no-build-isolation --no-deps . -w dist/

builds engine/cpu/csrc with torch's BuildExtension (the sources and flags of engine/cpu/build.py, so the same
multi-ISA module as a build on first use) into engine/cpu/prebuilt/, beside a build.json naming its key (sources,
flags, torch, Python). It loads only where that key matches, i.e. with the torch it was built against
(--no-build-isolation builds against the installed one); elsewhere it compiles on first use as a source install
does. Without SPECLENS_PREBUILD_KERNELS=1 (`pip install .`, `pip install -e .`) nothing is compiled at install.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent


def build_rules():
    """engine/cpu/build.py by path: its flags and key, without importing the engine package here."""
    spec = importlib.util.spec_from_file_location("speclens_build_rules", ROOT / "engine" / "cpu" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def kernel_build() -> dict:
    if os.environ.get("SPECLENS_PREBUILD_KERNELS") != "1":
        return {}
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    rules = build_rules()

    class BuildKernels(BuildExtension):
        def run(self) -> None:
            super().run()
            for ext in self.extensions:  # the manifest beside the module: what ext._prebuilt checks
                module = Path(self.get_ext_fullpath(ext.name))
                manifest = {"key": rules.key(), "module": module.name, "torch": torch.__version__,
                            "python": sys.version.split()[0]}
                (module.parent / rules.MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")

    # -g0 last: Python's own CFLAGS carry -g, which would ship ~10x the bytes for no speed
    kernels = CppExtension(
        f"engine.cpu.prebuilt.{rules.NAME}", [f"engine/cpu/csrc/{s}" for s in rules.SOURCES],
        extra_compile_args=[*rules.CFLAGS, "-g0"], extra_link_args=list(rules.LDFLAGS))
    return {"ext_modules": [kernels], "cmdclass": {"build_ext": BuildKernels}}


setup(**kernel_build())
