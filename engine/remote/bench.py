"""`speclens-bench --server URL [--plain-server URL2]`: the benchmark on an attached server.

Mode `draft` runs every prompt on the speculative server, mode `plain` on the plain one (the same model served
without a draft). K and speculation on/off are the servers' start-up flags: nothing here asks a server to change
them per request. Each result has what a local run reports, from the rounds rebuilt out of the stream
(engine/remote/rounds.py), and the speculative run is checked against the server's own /metrics: its drafted and
accepted totals (and drafts, and accepted per position) must equal the counters' deltas over the run.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

from engine.api.config import SamplingParams
from engine.api.events import Summary
from engine.remote.client import ServerClient, ServerInfo
from engine.remote.metrics import SpecCounters


@dataclass
class ServerResult:
    mode: str
    server: str  # URL, without credentials
    k: int  # the server's draft limit, or the most it drafted in a round when it does not say (0 for plain)
    temperature: float
    tokens_per_s: float  # decode rate: the server's own predicted_n / predicted_ms, over all prompts
    new_tokens: int
    rounds: int
    drafted_tokens: int
    accepted_tokens: int
    acceptance_rate: float
    mean_accepted_length: float  # tokens committed per round
    per_position_accepted: list[int] = field(default_factory=list)  # rounds in which position i was accepted
    seconds: float = 0.0  # end to end, client side
    e2e_tokens_per_s: float = 0.0  # new tokens / seconds: prompt processing and the network included
    outputs: list[str] = field(default_factory=list)  # the texts (a chat stream carries no token ids)
    metrics_delta: dict | None = None  # the server's /metrics counters over this run (None: no /metrics)
    matches_metrics: bool | None = None


def run_server_mode(client: ServerClient, prompts: list[list[dict[str, str]]], mode: str,
                    sampling: SamplingParams) -> ServerResult:
    """Every prompt once, one after another, on `client`; /metrics read before and after."""
    info = client.info
    assert info is not None, "probe() the server first"
    before = client.counters()
    summaries: list[Summary] = []
    per_pos: list[int] = []  # rounds in which draft position i was accepted
    drafts = 0  # rounds that drafted
    for messages in prompts:
        for item in client.chat(messages, sampling, speculative=mode != "plain"):
            if isinstance(item, Summary):
                summaries.append(item)
            else:
                for ev in item:
                    drafts += bool(ev.drafted)
                    for i, d in enumerate(ev.drafted):
                        per_pos.extend([0] * (i + 1 - len(per_pos)))
                        per_pos[i] += d.accepted
    after = client.counters()
    return _result(info, mode, sampling, summaries, per_pos, drafts, before, after)


def _result(info: ServerInfo, mode: str, sampling: SamplingParams, summaries: list[Summary], per_pos: list[int],
            drafts: int, before: SpecCounters | None, after: SpecCounters | None) -> ServerResult:
    new = sum(s.new_tokens for s in summaries)
    rounds = sum(s.rounds for s in summaries)
    drafted = sum(s.drafted for s in summaries)
    accepted = sum(s.accepted for s in summaries)
    decode_s = sum(s.verify_ms for s in summaries) / 1000.0
    # K: the server's own when it says; else the most it drafted in a round of this run (llama-server's
    # /props names no K)
    r = ServerResult(mode, info.url, 0 if mode == "plain" else (info.k or len(per_pos)), sampling.temperature,
                     new / decode_s if decode_s > 0 else 0.0, new, rounds, drafted, accepted,
                     accepted / drafted if drafted else 0.0, new / rounds if rounds else 0.0, per_pos,
                     sum(s.total_s for s in summaries))
    r.e2e_tokens_per_s = new / r.seconds if r.seconds > 0 else 0.0
    r.outputs = [s.text for s in summaries]
    if before is not None and after is not None:
        d = after.minus(before)
        r.metrics_delta = {"drafts": d.drafts, "drafted_tokens": d.draft_tokens, "accepted_tokens": d.accepted_tokens,
                           "accepted_per_pos": [d.accepted_per_pos.get(i, 0) for i in range(len(d.accepted_per_pos))]}
        pos = r.metrics_delta["accepted_per_pos"]
        r.matches_metrics = (d.draft_tokens == drafted and d.accepted_tokens == accepted and d.drafts == drafts
                             and pos[: len(per_pos)] + [0] * (len(per_pos) - len(pos)) == per_pos
                             and not any(pos[len(per_pos):]))
    return r


def table(results: list[ServerResult]) -> str:
    base = next((r.tokens_per_s for r in results if r.mode == "plain"), None)
    lines = [f"{'mode':<7}{'K':>3}{'tok/s':>8}{'speedup':>9}{'accept':>8}{'tok/round':>10}{'tokens':>8}"
             f"{'drafted':>9}{'accepted':>9}  /metrics"]
    for r in results:
        speed = f"{r.tokens_per_s / base:.2f}x" if base else "-"
        check = ("-" if r.matches_metrics is None else "equal" if r.matches_metrics else
                 f"DIFFERS ({r.metrics_delta})")
        lines.append(f"{r.mode:<7}{r.k:>3}{r.tokens_per_s:>8.2f}{speed:>9}{r.acceptance_rate:>8.2f}"
                     f"{r.mean_accepted_length:>10.2f}{r.new_tokens:>8}{r.drafted_tokens:>9}{r.accepted_tokens:>9}"
                     f"  {check}")
    return "\n".join(lines)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
