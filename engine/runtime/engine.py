"""The engine loop: a target, an optional draft, chat state with prefix reuse, and generate()."""
from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from dataclasses import replace
from functools import partial

import torch

from engine.spec.adaptive import AdaptiveK
from engine.api.config import NEEDS_DRAFT_MODEL, CacheConfig, SamplingParams, SpecParams
from engine.api.live import Controls
from engine.runtime.detok import Detokenizer
from engine.spec.drafters import Drafter, HybridDrafter, ModelDrafter, NGramDrafter, Proposal, common_prefix, forward_chunked
from engine.api.events import CommittedToken, DraftToken, Origin, RoundEvent, Summary
from engine.spec.inspection import inspect_round
from engine.model.kv_cache import BlockManager, KVPool
from engine.model.transformer import Transformer
from engine.quant import kernels_name
from engine.spec.accept import Verdict, accept_reject
from engine.runtime.stepping import RoundSteps, cache_marks
from engine.spec.sampling import probs_for_positions, sample
from engine.runtime.stops import StopChecker

class Engine:
    def __init__(
        self, target: Transformer, tokenizer, draft: Transformer | None = None, *,
        cache: CacheConfig | None = None, target_name: str = "target", draft_name: str | None = None,
        eos_ids: set[int] | None = None,
    ) -> None:
        self.target, self.tokenizer, self.draft = target, tokenizer, draft
        self.target_name, self.draft_name = target_name, draft_name
        self.load_seconds = 0.0
        self.weights_format: str | None = None  # e.g. "Q4_K_M" when the target runs a GGUF's own blocks
        p = next(target.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.vocab = target.cfg.vocab_size
        if draft is not None and draft.cfg.vocab_size != self.vocab:
            raise ValueError(
                f"vocabulary mismatch: draft has {draft.cfg.vocab_size} tokens, target has {self.vocab}"
            )
        models = {"target": target} | ({"draft": draft} if draft is not None else {})
        default_len = min([m.cfg.max_position_embeddings for m in models.values()] + [4096])
        self.cache_cfg = cache or CacheConfig(max_seq_len=default_len)
        self.max_seq_len = self.cache_cfg.max_seq_len
        for role, model in models.items():
            check_context(role, model, self.max_seq_len)
        if eos_ids is None:  # default: the config's and the tokenizer's EOS
            eos_ids = set(target.cfg.eos_token_ids) | {getattr(tokenizer, "eos_token_id", None)} - {None}
        self.eos_ids = set(eos_ids)
        self.target_pool = self._pool(target)
        self.target_pool.manager.allocate(0)
        self.ids: list[int] = []  # the conversation so far; the target cache holds ids[:cache length]
        self.model_drafter = (
            ModelDrafter(draft, self._pool(draft), self.vocab, self.device) if draft is not None else None
        )
        self.ngram_drafter = NGramDrafter(self.vocab, self.device)
        self.hybrid_drafter = HybridDrafter(self.ngram_drafter, self.model_drafter) if self.model_drafter else None
        self._active: object | None = None  # the running generate() call, if any (one at a time)
        self.paused_s = 0.0  # time held by step-through (engine/stepping.py): `_clock` leaves it out
        self._pieces: dict[int, str] = {}  # token id -> its text alone (the inspector names ~20 tokens a row)
        self.inspect = True  # record the inspector's rows in each RoundEvent (~1-3 ms a round for 150k tokens on CPU)

    def _clock(self) -> float:
        """perf_counter without the time step-through held the engine: a stepped round times like any other."""
        return time.perf_counter() - self.paused_s

    def _pool(self, model: Transformer) -> KVPool:
        c = self.cache_cfg
        m = BlockManager(c.blocks, c.block_size, c.max_seq_len)
        return KVPool(model.cfg.num_layers, model.cfg.num_kv_heads, model.cfg.head_dim, m, self.dtype, self.device)

    @property
    def dtype_name(self) -> str:
        """What the user sees: the tensor type, or the GGUF's quantization when the target runs it as it is, and
        the instruction set of the kernels that run it (the speed differs by up to 2x between them)."""
        if self.weights_format:
            return f"{self.weights_format}, int8 activations, {kernels_name()}"
        return str(self.dtype).removeprefix("torch.")

    # -- chat ---------------------------------------------------------------------------------------

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Apply the target's chat template with the generation prompt."""
        if getattr(self.tokenizer, "chat_template", None):
            out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
        return self.tokenizer.encode(text)

    def reset(self) -> None:
        """Forget the cached conversation (both caches)."""
        self.target_pool.manager.truncate_to(0, 0)
        self.ids = []
        if self.model_drafter:
            self.model_drafter.reset()
        self.ngram_drafter.reset()

    def _drafter(self, spec: SpecParams) -> Drafter | None:
        if spec.drafter in NEEDS_DRAFT_MODEL and self.model_drafter is None:
            raise ValueError(f"the {spec.drafter!r} drafter needs a draft model; load one or choose the n-gram drafter")
        if spec.drafter == "model":
            return self.model_drafter
        self.ngram_drafter.configure(spec.ngram_min, spec.ngram_max)
        return self.hybrid_drafter if spec.drafter == "hybrid" else self.ngram_drafter

    def _check_prompt(self, prompt: list[int], params: SamplingParams) -> None:
        if not prompt:
            raise ValueError("the prompt is empty")
        bad = [t for t in prompt if not 0 <= t < self.vocab]
        if bad:
            raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary (0..{self.vocab - 1})")
        if len(prompt) >= self.max_seq_len:
            raise ValueError(
                f"the prompt has {len(prompt)} tokens but the context holds {self.max_seq_len}; "
                "start a new chat or shorten the message"
            )

    def _prefill(self, prompt: list[int]) -> int:
        """Bring the target cache to prompt[:-1], reusing the longest cached prefix. Returns tokens reused.

        If the forward pass fails (e.g. out of memory on a long paste), `ids` is cut back to what the cache
        really holds, so a retry recomputes the rest instead of reusing positions that were never written.
        """
        m = self.target_pool.manager
        reused = min(common_prefix(self.ids[: m.length(0)], prompt), len(prompt) - 1)
        m.truncate_to(0, reused)
        feed = prompt[reused:-1]
        try:
            if feed:
                forward_chunked(self.target, self.target_pool, 0, feed, self.device)
        except BaseException:
            self.ids = list(prompt[: m.length(0)])  # forward_chunked gave back the failed chunk's positions
            raise
        self.ids = list(prompt)
        return reused

    # -- generation ---------------------------------------------------------------------------------

    def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, spec: SpecParams, controls: Controls | None = None,
    ) -> Iterator[RoundEvent | Summary]:
        """Rounds of draft -> verify -> accept/reject, one RoundEvent each, then a Summary.

        Invariant between rounds: the target cache holds ids[:-1]; the last committed token g is fed
        with the next round's verify pass [g, t1..tK]. Closing the iterator between rounds leaves
        both caches consistent.

        One request at a time: both requests would share the caches and `ids`, so a second generator
        started while one is active raises RuntimeError at its first next(); the first one is unaffected.
        Finishing, closing or an error releases the engine.
        """
        if self._active is not None:
            raise RuntimeError(
                "this engine is already running a generate() request; finish or close() it before starting another"
            )
        owner = self._active = object()
        try:
            yield from self._generate(prompt_ids, sampling, spec, controls)
        finally:
            if self._active is owner:
                self._active = None

    def _generate(
        self, prompt_ids: list[int], sampling: SamplingParams, spec: SpecParams, controls: Controls | None,
    ) -> Iterator[RoundEvent | Summary]:
        self._check_prompt(prompt_ids, sampling)
        if spec.enabled:
            self._drafter(spec)  # fail fast on a drafter that cannot run
        controls = controls or Controls(sampling, spec)
        gen = torch.Generator(self.device)
        gen.manual_seed(sampling.seed if sampling.seed is not None else secrets.randbits(63))  # global RNG untouched
        max_new = sampling.max_new_tokens

        t0 = self._clock()
        reused = self._prefill(prompt_ids)
        prefill_s = self._clock() - t0
        prompt_len = len(prompt_ids)
        forwards = 1 if prompt_len - 1 > reused else 0
        detok = Detokenizer(self.tokenizer)
        stops = StopChecker(sampling.stop)
        adaptive = AdaptiveK()
        text: list[str] = []
        pos_drafted: list[int] = []
        pos_accepted: list[int] = []
        drafted_total = accepted_total = rounds = 0
        draft_ms_total = verify_ms_total = draft_prefill_ms_total = 0.0
        ttft = None
        stop_reason: str | None = None
        tail = ""  # text released at a cancel, after the last RoundEvent

        try:
            while stop_reason is None:
                if controls.cancelled:
                    stop_reason = "cancelled"
                    tail = release_text(detok, stops)  # what was held back now belongs to the reply
                    break
                # Per-round controls; the seed and the length budget belong to the request.
                params = replace(controls.sampling, seed=sampling.seed, max_new_tokens=max_new, stop=sampling.stop)
                spec = controls.spec
                generated = len(self.ids) - prompt_len
                # Sequence-length guard: verify writes K+1 positions after ids[:-1].
                k = adaptive.choose(spec) if spec.adaptive else spec.k
                k = min(k, self.max_seq_len - len(self.ids), max_new - generated - 1)
                drafter = self._drafter(spec) if spec.enabled and k >= 1 else None

                t_round = self._clock()
                proposal = drafter.propose(self.ids, k, params, gen, spec.stop_below) if drafter else None
                t_drafted = self._clock()
                source = (proposal.source or drafter.name) if drafter else None  # under the hybrid, the one that drafted
                steps = RoundSteps(self, controls, rounds + 1, source, k, proposal) if controls.gate.stepping else None
                if steps is not None:
                    steps.drafted()
                drafted = proposal.tokens if proposal is not None else torch.empty(0, dtype=torch.long)
                verdict_tokens, committed_origin, verdict, inspect = self._verify(drafted, proposal, params, gen, steps)
                forwards += 1
                t_verified = self._clock()
                positions = inspect() if self.inspect else ()  # after the clock: verify_ms stays the verify's own
                rounds += 1

                n_acc = verdict.accepted
                new = verdict_tokens
                # Stops: EOS, stop strings and the length budget; anything after a stop is discarded.
                committed: list[CommittedToken] = []
                delta_parts: list[str] = []
                for i, tok in enumerate(new):
                    piece = detok.push(tok)
                    piece, hit = stops.feed(piece)
                    self.ids.append(tok)
                    origin = committed_origin[i]
                    if tok in self.eos_ids:
                        stop_reason = "eos"
                    elif hit:
                        stop_reason = "stop"
                    elif len(self.ids) - prompt_len >= max_new or len(self.ids) >= self.max_seq_len:
                        stop_reason = "length"
                    if stop_reason and stop_reason != "stop":
                        piece += release_text(detok, stops)  # held back as a possible stop-string start
                    q = verdict.q_drafted[i] if i < n_acc else None
                    p = verdict.p_drafted[i] if i < n_acc else verdict.p_next
                    committed.append(CommittedToken(tok, piece, origin, i, p, q))
                    delta_parts.append(piece)
                    if stop_reason:
                        break
                # Rollback: both caches keep only committed ids (all but the last token).
                marks = cache_marks(self, drafter) if steps is not None else []
                self.target_pool.manager.truncate_to(0, len(self.ids) - 1)
                if drafter is not None:
                    drafter.rollback(self.ids)
                if steps is not None:
                    steps.decided(n_acc, verdict.p_drafted, committed, marks, cache_marks(self, drafter))
                if ttft is None:
                    ttft = t_verified - t0

                draft_tokens = tuple(
                    DraftToken(t, self._piece(t), verdict.q_drafted[i], verdict.p_drafted[i], i < n_acc)
                    for i, t in enumerate(drafted.tolist())
                )
                for i, d in enumerate(draft_tokens):
                    if i >= len(pos_drafted):
                        pos_drafted.append(0)
                        pos_accepted.append(0)
                    pos_drafted[i] += 1
                    pos_accepted[i] += d.accepted
                drafted_total += len(draft_tokens)
                accepted_total += n_acc
                # The draft's prompt prefill is reported on its own: it is not a cost of drafting K tokens.
                prefill_ms = proposal.prefill_s * 1e3 if proposal is not None else 0.0
                d_ms, v_ms = max(0.0, (t_drafted - t_round) * 1e3 - prefill_ms), (t_verified - t_drafted) * 1e3
                # adaptive K prices the model's draft steps: a hybrid's free n-gram rounds would make them look cheap
                if spec.adaptive and draft_tokens and (drafter is not self.hybrid_drafter or source == "model"):
                    adaptive.observe(len(draft_tokens), n_acc, d_ms / 1e3 / len(draft_tokens), v_ms / 1e3)
                draft_ms_total += d_ms
                verify_ms_total += v_ms
                draft_prefill_ms_total += prefill_ms
                delta = "".join(delta_parts)
                text.append(delta)
                yield RoundEvent(
                    round=rounds, mode="speculative" if drafter else "plain",
                    drafter=source, k=k if drafter else 0,
                    temperature=params.temperature, drafted=draft_tokens, committed=tuple(committed),
                    text_delta=delta, draft_ms=d_ms, verify_ms=v_ms, elapsed_s=self._clock() - t0,
                    new_tokens=len(self.ids) - prompt_len, stop_reason=stop_reason, draft_prefill_ms=prefill_ms,
                    positions=positions,
                )
        finally:
            # Whatever happened (cancel, an exception, the consumer closing us), leave the caches consistent.
            self.target_pool.manager.truncate_to(0, max(0, min(self.target_pool.manager.length(0), len(self.ids) - 1)))
            if self.model_drafter:
                self.model_drafter.rollback(self.ids)

        total = self._clock() - t0
        new_ids = self.ids[prompt_len:]
        yield Summary(
            new_tokens=len(new_ids), rounds=rounds, target_forwards=forwards, drafted=drafted_total,
            accepted=accepted_total, acceptance_rate=accepted_total / drafted_total if drafted_total else 0.0,
            mean_tokens_per_round=len(new_ids) / rounds if rounds else 0.0,
            per_position_acceptance=tuple(a / d for a, d in zip(pos_accepted, pos_drafted)),
            tokens_per_s=len(new_ids) / (total - prefill_s) if total > prefill_s else 0.0, ttft_s=ttft if ttft is not None else total,
            total_s=total, prompt_tokens=prompt_len, reused_prefix_tokens=reused,
            draft_ms=draft_ms_total, verify_ms=verify_ms_total, stop_reason=stop_reason or "cancelled",
            text="".join(text) + tail, token_ids=tuple(new_ids), prefill_s=prefill_s,
            draft_prefill_ms=draft_prefill_ms_total, text_tail=tail,
        )

    def _verify(self, drafted: torch.Tensor, proposal: Proposal | None, params: SamplingParams, gen,
                steps: RoundSteps | None = None):
        """Feed [g, t1..tK] to the target in one pass and apply the accept/reject rule. Also returns a callable
        that computes the round's inspector data (engine/inspector.py) from the same tensors."""
        m = self.target_pool.manager
        g = self.ids[-1]
        feed = torch.cat([torch.tensor([g], dtype=torch.long, device=self.device), drafted.to(self.device)])
        start, end = m.append(0, len(feed))
        logits = self.target(feed, start, self.target_pool.view(0, start, end))  # (K+1, V)
        context = torch.tensor(self.ids, dtype=torch.long, device=self.device)
        p = probs_for_positions(logits[:, : self.vocab], params, context, drafted)  # (K+1, V)
        if steps is not None:  # step-through: p beside q, before anything is decided
            steps.verified(p)
        shown = logits[:, : self.vocab] if params.greedy else None  # point masses say little: show the logits
        if len(drafted) == 0:  # a plain decode step
            tok = sample(p[0], gen)
            return [tok], [Origin.PLAIN], Verdict(0, tok, (), (), float(p[0, tok])), partial(
                inspect_round, p, None, drafted, (), 0, tok, self._piece, logits=shown)
        assert proposal is not None
        v = accept_reject(drafted, proposal.q, p, gen)
        tokens = drafted[: v.accepted].tolist() + [v.next_token]
        origins = [Origin.ACCEPTED] * v.accepted + [Origin.BONUS if v.bonus else Origin.CORRECTED]
        inspect = partial(inspect_round, p, proposal.q, drafted, v.u, v.accepted, v.next_token, self._piece,
                          logits=shown, draft_logits=proposal.logits if shown is not None else None)
        return tokens, origins, v, inspect

    def _piece(self, token: int) -> str:
        text = self._pieces.get(token)
        if text is None:
            text = self._pieces[token] = self.tokenizer.decode(
                [token], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return text


def check_context(role: str, model: Transformer, max_seq_len: int) -> None:
    """A cache longer than the model was trained for (or than its RoPE table) is refused up front."""
    limit = model.cfg.max_position_embeddings
    if max_seq_len > limit:
        raise ValueError(
            f"context length {max_seq_len} exceeds the {role} model's max_position_embeddings ({limit}); "
            f"use a cache of at most {limit} positions"
        )
    table = model.rope.cos.shape[0]
    if max_seq_len > table:
        raise ValueError(f"context length {max_seq_len} exceeds the {role} model's {table} RoPE positions")


def release_text(detok: Detokenizer, stops: StopChecker) -> str:
    """At a non-stop ending: the text still held back (an unfinished character, a possible stop-string start)."""
    piece, hit = stops.feed(detok.flush())
    return piece if hit else piece + stops.flush()
