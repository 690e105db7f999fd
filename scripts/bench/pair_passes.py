"""One forward pass of the embedded pair's target or draft at a time, after a prompt: the core the pass-timing scripts
share (bench_cpu's pass costs, ab_builds, bench_neighbour, pass_bound)."""
from __future__ import annotations

import time

import torch

from engine.model.forward import forward_chunked


class PairPasses:
    """The models' caches hold the prompt but its last token; `once` rolls a model's cache back there and times one
    pass over `width` tokens (the last one repeated: a verify pass of K = width - 1 costs the same whatever the ids)."""

    def __init__(self, engine, prompt: list[int], draft: bool = True) -> None:
        self.prompt = prompt
        self.models = {"target": (engine.target, engine.target_pool, 0)}
        if draft and engine.model_drafter is not None:
            d = engine.model_drafter
            self.models["draft"] = (d.model, d.pool, d.seq)
        engine.reset()
        for model, pool, seq in self.models.values():
            forward_chunked(model, pool, seq, prompt[:-1], engine.device)
        self.base = len(prompt) - 1

    def once(self, kind: str, width: int) -> float:
        """ms of one pass of model `kind` ("target" or "draft") over `width` tokens."""
        model, pool, seq = self.models[kind]
        pool.manager.truncate_to(seq, self.base)
        start, end = pool.manager.append(seq, width)
        feed = torch.tensor(self.prompt[-1:] * width, dtype=torch.long)
        t = time.perf_counter()
        model(feed, start, pool.view(seq, start, end))
        return (time.perf_counter() - t) * 1e3
