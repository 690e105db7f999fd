"""speclens-models: the models on this machine (embedded pair, Hugging Face cache, LM Studio, Ollama, llama.cpp),
each with whether SpecLens runs it or why not. Reads headers only; never downloads, never writes."""
from __future__ import annotations

import argparse
import json
import logging
import sys

from engine.io.hub import LocalModel, list_local_models
from engine.io.model_dirs import size_text


def record(m: LocalModel) -> dict:
    """One model as the --json output gives it."""
    return {"source": m.source, "name": m.name, "path": str(m.path), "family": m.arch,
            "params_b": m.params_b or None, "quant": m.quant or None, "context": m.context_limit or None,
            "runnable": m.runnable, "why_not": m.why_not or None, "note": m.note or None}


def table(models: list[LocalModel]) -> str:
    head = ("SOURCE", "NAME", "FAMILY", "PARAMS", "QUANT", "CONTEXT", "RUNS")
    rows = [(m.source, m.name, m.arch, size_text(m.params_b), m.quant or "?",
             str(m.context_limit or "?"), "yes" if m.runnable else "no: " + m.why_not) for m in models]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in [head, *rows]]
    lines += [f"note: {m.name}: {m.note}" for m in models if m.note]
    return "\n".join(line.rstrip() for line in lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="speclens-models", description=__doc__)
    p.add_argument("--json", action="store_true", help="one JSON list, for scripts")
    a = p.parse_args(argv)
    # Skipped entries (a missing blob, a truncated download) are told on stderr, apart from the list
    logging.basicConfig(level=logging.WARNING, format="speclens-models: %(message)s", stream=sys.stderr)
    models = list_local_models(include_unrunnable=True)
    if a.json:
        print(json.dumps([record(m) for m in models], indent=1))
    elif models:
        print(table(models))
    else:
        print("no models found (looked in the Hugging Face cache, LM Studio, Ollama and llama.cpp's folders)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
