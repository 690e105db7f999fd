"""`python -m engine.cpu`: which kernels load here (building them if need be); exit 1 on the fallback.
`python -m engine.cpu prebuilt DIR`: that module and its manifest into DIR, for a bundle to ship
(packaging/build_bundle.sh)."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

from engine.cpu import build, ext


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if len(args) == 2 and args[0] == "prebuilt":
        mod = ext.load()
        if mod is None:
            print(f"no kernels to ship: {ext.notice()}", file=sys.stderr)
            return 1
        if Path(mod.__file__).resolve().parent == Path(args[1]).resolve():
            print(mod.__file__)  # already the prebuilt module there
            return 0
        print(build.write_prebuilt(Path(mod.__file__), Path(args[1])))
        return 0
    if args:
        print("usage: python -m engine.cpu [prebuilt DIR]", file=sys.stderr)
        return 2
    print(ext.describe())
    return 0 if ext.load() is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
