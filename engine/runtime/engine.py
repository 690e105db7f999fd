"""The engine loop: a target, an optional draft, chat state with prefix reuse, and generate()."""
from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from dataclasses import replace

import torch

from engine.api.config import NEEDS_DRAFT_MODEL, CacheConfig, SamplingParams, SpecParams
from engine.api.errors import ContextFullError
from engine.api.events import DraftToken, PrefillProgress, RoundEvent, Summary
from engine.api.live import Controls, plain_step_due
from engine.api.messages import check_messages, check_prompt_ids
from engine.model.forward import chunk_tokens, common_prefix, forward_chunked
from engine.model.kv_cache import BlockManager, KVPool
from engine.model.pages import HugePages
from engine.model.transformer import Transformer
from engine.cpu import kernels_name
from engine.cpu.threads import ThreadGovernor
from engine.runtime.clock import Clock
from engine.runtime.detok import TokenTexts
from engine.runtime.stepping import NO_STEPS, Marks, NoSteps, RoundSteps
from engine.runtime.tally import RoundTally
from engine.runtime.transcript import Transcript
from engine.runtime.verify import decide, inspector_rows, score
from engine.spec.accept import Verdict
from engine.spec.drafters import Drafter, HybridDrafter, ModelDrafter, NGramDrafter, Outcome, Proposal
from engine.spec.drafters.base import DraftStopped


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
        self.huge_pages: HugePages | None = None  # moving the packed matrices onto 2 MB pages (engine.model.pages)
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
        self.clock = Clock()  # leaves out the time step-through held the engine
        self.text_of = TokenTexts(tokenizer)
        self.inspect = True  # record the inspector's rows in each RoundEvent (a few ms a round: docs/performance.md)
        # on the CPU, the kernels run on the cores other programs leave free (engine/cpu/threads.py); a GPU's
        # governor measures nothing and so never changes the count
        self.threads = ThreadGovernor() if self.device.type == "cpu" else ThreadGovernor.fixed()

    @property
    def drafters(self) -> list[Drafter]:
        return [d for d in (self.model_drafter, self.ngram_drafter) if d is not None]

    def _pool(self, model: Transformer) -> KVPool:
        c = self.cache_cfg
        m = BlockManager(c.blocks, c.block_size, c.max_seq_len)
        return KVPool(model.cfg.num_layers, model.cfg.num_kv_heads, model.cfg.head_dim, m, model.kv_dtype or self.dtype,
                      self.device)

    @property
    def dtype_name(self) -> str:
        """What the user sees: the tensor type, or the GGUF's quantization when the target runs it as it is, and
        the instruction set of the kernels that run it (the speed differs by up to 2x between them)."""
        if self.weights_format:
            return f"{self.weights_format}, int8 activations, {kernels_name()}"
        dtype = str(self.dtype).removeprefix("torch.")
        return f"{dtype}, {kernels_name()}" if self.target.stack is not None else dtype  # a dense model on the kernels

    # -- chat ---------------------------------------------------------------------------------------

    def settle(self, timeout: float = 30.0) -> int:
        """Wait (at most timeout seconds) for the background work a load leaves (huge pages), so that a benchmark
        times the steady state; returns the bytes of weights now on huge pages."""
        if self.huge_pages is None:
            return 0
        self.huge_pages.wait(timeout)
        return self.huge_pages.bytes

    def twin(self) -> Engine:
        """Another engine on the same weights, with caches, drafters and policy estimates of its own. The weights
        are read only, so twins may take turns round by round in one thread (a benchmark times several modes in
        the same seconds so); never run two at once."""
        twin = Engine(self.target, self.tokenizer, self.draft, cache=self.cache_cfg, target_name=self.target_name,
                      draft_name=self.draft_name, eos_ids=self.eos_ids)
        twin.weights_format, twin.load_seconds = self.weights_format, self.load_seconds
        return twin

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Apply the target's chat template with the generation prompt."""
        messages = check_messages(messages)  # before the template: it would fail on them in its own words
        if getattr(self.tokenizer, "chat_template", None):
            out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
        return self.tokenizer.encode(text)

    def reset(self) -> None:
        """Forget the cached conversation (both caches). Refused while a request runs: its next round would read
        the caches this empties."""
        if self._active is not None:
            raise RuntimeError("cannot reset the engine while a generate() request is running; let it finish or "
                               "close() it first")
        self.target_pool.manager.truncate_to(0, 0)
        self.ids = []
        if self.model_drafter:
            self.model_drafter.reset()
        self.ngram_drafter.reset()

    def _drafter(self, spec: SpecParams) -> Drafter:
        """The drafter spec names, configured with it."""
        if spec.drafter in NEEDS_DRAFT_MODEL and self.model_drafter is None:
            raise ValueError(f"the {spec.drafter!r} drafter needs a draft model; load one or choose the n-gram drafter")
        drafter = {"model": self.model_drafter, "ngram": self.ngram_drafter, "hybrid": self.hybrid_drafter}[spec.drafter]
        drafter.configure(spec)
        return drafter

    def _check_prompt(self, prompt: list[int]) -> list[int]:
        prompt = check_prompt_ids(prompt)
        if not prompt:
            raise ValueError("the prompt is empty")
        bad = [t for t in prompt if not 0 <= t < self.vocab]
        if bad:
            raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary (0..{self.vocab - 1})")
        if len(prompt) >= self.max_seq_len:
            raise ContextFullError(
                f"The message does not fit: with the system prompt and the conversation so far it is {len(prompt)} "
                f"tokens, and the context holds {self.max_seq_len}. Start a new chat or shorten the message."
            )
        return prompt

    def _prefill(self, prompt: list[int], stop: Callable[[], bool] | None = None,
                 progress: Reporter | None = None) -> int:
        """Bring the target cache to prompt[:-1], reusing the longest cached prefix. Returns tokens reused.
        `progress` hears (tokens read, tokens to read, tokens reused) before the first chunk and after each.

        If the forward pass fails (e.g. out of memory on a long paste), `ids` is cut back to what the cache
        really holds, so a retry recomputes the rest instead of reusing positions that were never written.
        A `stop` between chunks (a cancel) leaves the chunks done cached, with `ids` one past them as always.
        """
        m = self.target_pool.manager
        reused = min(common_prefix(self.ids[: m.length(0)], prompt), len(prompt) - 1)
        m.truncate_to(0, reused)
        feed = prompt[reused:-1]
        read = None
        if progress is not None and feed:
            progress(0, len(feed), reused)
            read = lambda done: progress(done, len(feed), reused)
        try:
            if feed and forward_chunked(self.target, self.target_pool, 0, feed, self.device, stop, False,
                                        read) is None:
                self.ids = list(prompt[: m.length(0) + 1])
                return reused
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
        The Summary (a consumer may stop reading there), closing or an error releases the engine.
        """
        if self._active is not None:
            raise RuntimeError(
                "this engine is already running a generate() request; finish or close() it before starting another"
            )
        owner = self._active = object()
        inner = self._generate(prompt_ids, sampling, spec, controls)
        try:
            for item in inner:
                if isinstance(item, Summary):  # the end of the request, whether or not the consumer reads on
                    self._active = None
                yield item
        finally:
            inner.close()  # a consumer's close() reaches the round loop's clean-up now, not at collection
            if self._active is owner:
                self._active = None

    def _generate(
        self, prompt_ids: list[int], sampling: SamplingParams, spec: SpecParams, controls: Controls | None,
    ) -> Iterator[RoundEvent | Summary]:
        prompt_ids = self._check_prompt(prompt_ids)
        if spec.enabled:
            self._drafter(spec)  # fail fast on a drafter that cannot run
        controls = controls or Controls(sampling, spec)
        gen = torch.Generator(self.device)
        gen.manual_seed(sampling.seed if sampling.seed is not None else secrets.randbits(63))  # global RNG untouched
        for drafter in self.drafters:
            drafter.start()
        if self.hybrid_drafter is not None:  # its policy's estimates of this request start over too
            self.hybrid_drafter.start_policy()
        if self.model_drafter is not None:  # its lazy prefill of a long prompt stops between chunks too
            self.model_drafter.stop = lambda: controls.cancelled
            self.model_drafter.progress = reporter(controls, "draft", self.device)
        self.threads.begin()
        t0 = self.clock.now()
        # a long prompt stops between its chunks, and says how far it has read after each
        try:
            reused = self._prefill(prompt_ids, lambda: controls.cancelled, reporter(controls, "target", self.device))
        except BaseException:
            self.threads.end()
            raise
        tally = RoundTally(len(prompt_ids), reused, self.clock.now() - t0, prefilled=len(prompt_ids) - 1 > reused)
        transcript = Transcript(self.tokenizer, self.ids, sampling.stop, self.eos_ids, sampling.max_new_tokens,
                                self.max_seq_len)
        stop, tail = None, ""  # tail: text released at a cancel, after the last RoundEvent
        try:
            while stop is None:
                if controls.cancelled:
                    stop, tail = "cancelled", transcript.release()  # what was held back belongs to the reply
                    break
                self.threads.update()
                try:
                    event = self._round(tally.rounds + 1, controls, sampling, transcript, gen, t0, tally)
                except DraftStopped:  # a cancel reached the draft model's prompt prefill: no round
                    stop, tail = "cancelled", transcript.release()
                    break
                stop = event.stop_reason
                yield event
        finally:
            self._settle()  # whatever happened (cancel, an exception, the consumer closing us)
        yield tally.summary(self.clock.now() - t0, stop or "cancelled", tail)

    def _round(self, round_no: int, controls: Controls, sampling: SamplingParams, transcript: Transcript,
               gen: torch.Generator, t0: float, tally: RoundTally) -> RoundEvent:
        """One round: draft, verify, accept/reject, commit, roll back, report."""
        # Per-round controls; the seed, the length budget and the stop strings belong to the request.
        params = replace(controls.sampling, seed=sampling.seed, max_new_tokens=sampling.max_new_tokens,
                         stop=sampling.stop)
        spec = controls.spec
        if plain_step_due(round_no, controls.plain_every):  # the next round goes on with spec
            spec = spec.with_(enabled=False)
        drafter, k = self._plan(spec, transcript.room())
        # Draft.
        t_round = self.clock.now()
        proposal = drafter.propose(self.ids, k, params, gen) if drafter else None
        t_drafted = self.clock.now()
        source = (proposal.source or drafter.name) if drafter else None  # under the hybrid, the one that drafted
        steps = self._steps(controls, round_no, drafter, source, k, proposal)
        steps.drafted()
        drafted = proposal.tokens if proposal is not None else torch.empty(0, dtype=torch.long)
        # Verify, then accept/reject.
        scores = score(self.target, self.target_pool, self.ids, drafted, params, self.vocab, self.device)
        steps.verified(scores.p)
        tokens, origins, verdict = decide(drafted, proposal, scores.p, gen)
        t_verified = self.clock.now()
        positions = (inspector_rows(scores, drafted, proposal, verdict, self.text_of, params.greedy)
                     if self.inspect else ())  # after the clock: verify_ms stays the verify's own
        # Commit, then roll back what was not committed.
        committed, stop = transcript.commit(tokens, origins, verdict)
        steps.before_rollback()
        self._roll_back(drafter)
        steps.decided(verdict.accepted, verdict.p_drafted, committed)
        # Report.
        prefill_ms = proposal.prefill_s * 1e3 if proposal is not None else 0.0  # not a cost of drafting K tokens
        event = RoundEvent(
            round=round_no, mode="speculative" if drafter else "plain", drafter=source, k=k if drafter else 0,
            temperature=params.temperature, drafted=self._draft_tokens(drafted, verdict),
            committed=tuple(committed), text_delta="".join(c.text for c in committed),
            draft_ms=max(0.0, (t_drafted - t_round) * 1e3 - prefill_ms), verify_ms=(t_verified - t_drafted) * 1e3,
            elapsed_s=self.clock.now() - t0, new_tokens=transcript.generated, stop_reason=stop,
            draft_prefill_ms=prefill_ms, positions=positions, reason=proposal.reason if proposal is not None else "",
        )
        tally.add(event, t_verified - t0)
        if drafter is not None:
            drafter.observe(Outcome(source, len(event.drafted), verdict.accepted, event.draft_ms / 1e3,
                                    event.verify_ms / 1e3, spec.adaptive))
        return event

    def _plan(self, spec: SpecParams, room: int) -> tuple[Drafter | None, int]:
        """The round's drafter and K (None, 0 for a plain step): the drafter's choice, within the room left."""
        if not spec.enabled or room < 1:
            return None, 0
        drafter = self._drafter(spec)
        return drafter, min(drafter.choose_k(spec), room)

    def _steps(self, controls: Controls, round_no: int, drafter: Drafter | None, source: str | None, k: int,
               proposal: Proposal | None) -> NoSteps:
        if not controls.gate.stepping:
            return NO_STEPS
        return RoundSteps(controls, self.clock, lambda: self._cache_marks(drafter), self.text_of, round_no, source,
                          k, proposal)

    def _cache_marks(self, drafter: Drafter | None) -> Marks:
        """What the target's cache and the draft model's (when the round's drafter uses it) hold now."""
        m = self.target_pool.manager
        marks = [("target", m.length(0), len(m.block_table(0)))]
        if drafter is not None and drafter is not self.ngram_drafter and self.model_drafter is not None:
            d, seq = self.model_drafter.pool.manager, self.model_drafter.seq
            marks.append(("draft", d.length(seq), len(d.block_table(seq))))
        return marks

    def _draft_tokens(self, drafted: torch.Tensor, v: Verdict) -> tuple[DraftToken, ...]:
        return tuple(DraftToken(t, self.text_of(t), v.q_drafted[i], v.p_drafted[i], i < v.accepted)
                     for i, t in enumerate(drafted.tolist()))

    def _roll_back(self, drafter: Drafter | None) -> None:
        """Both caches keep only committed ids (all but the last token, which the next round's verify feeds)."""
        self.target_pool.manager.truncate_to(0, len(self.ids) - 1)
        if drafter is not None:
            drafter.rollback(self.ids)

    def _settle(self) -> None:
        """Leave the caches consistent with `ids` whatever ended the request."""
        m = self.target_pool.manager
        m.truncate_to(0, max(0, min(m.length(0), len(self.ids) - 1)))
        if self.model_drafter:
            self.model_drafter.rollback(self.ids)
        self.threads.end()


Reporter = Callable[[int, int, int], None]  # (tokens read, tokens to read, tokens reused) of one prefill


def reporter(controls: Controls, model: str, device: torch.device) -> Reporter | None:
    """What a prefill of `model` tells `controls.on_prefill`: a PrefillProgress per chunk, for prefills of more than
    one chunk (a shorter one is over before a word about it could be read). None when nobody listens."""
    listener = controls.on_prefill
    if listener is None:
        return None

    def report(done: int, total: int, reused: int) -> None:
        if total > chunk_tokens(device):
            listener(PrefillProgress(model, done, total, reused))

    return report


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

