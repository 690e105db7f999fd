"""The compiled kernels travel with the program: a binary wheel and the PyInstaller bundle, each built
here from this checkout, load them with no compiler on PATH and an empty SPECLENS_CACHE, and their --load-test
names the kernels' instruction set (not the fallback). The scripts are packaging/check_wheel.sh and
packaging/check_bundle.sh; these tests are how CI runs them (about 1.5 and 6 minutes on 2 cores)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OK = re.compile(r"^load-test ok: \S+ \+ \S+ on cpu \(Q\w+, int8 activations, (.+) kernels\), "
                r"loaded [\d.]+ s after start$", re.M)

pytestmark = pytest.mark.embedded  # both load the embedded pair (provisioned on first use)


def check(script: str, *args: str, timeout: int) -> str:
    out = subprocess.run([str(ROOT / "packaging" / script), *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert OK.search(out.stdout), out.stdout[-4000:]
    assert "fallback" not in out.stdout
    return out.stdout


def test_the_wheel_loads_its_prebuilt_kernels_with_no_compiler_and_an_empty_cache():
    out = check("check_wheel.sh", timeout=900)
    assert re.search(r"^wheel: speclens-[\w.]+-cp\d+-cp\d+-linux_x86_64\.whl", out, re.M), out
    assert re.search(r"^\S.* kernels \(prebuilt\)$", out, re.M), out  # python -m engine.cpu, from the wheel


def test_the_bundle_loads_its_prebuilt_kernels_with_no_compiler_and_an_empty_cache(tmp_path):
    try:
        out = check("check_bundle.sh", str(tmp_path / "dist"), timeout=1500)
    finally:
        shutil.rmtree(tmp_path / "dist", ignore_errors=True)  # about 1 GB
    assert re.search(r"^bundle: .*, \d+ MB, built in \d+ s$", out, re.M), out
