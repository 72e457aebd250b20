"""Speculative decoding of one request: prefill, then draft -> verify -> accept -> roll back rounds.

State after every round (docs/method.md, "The round"), with `committed` = prompt + generated tokens:
    target cache length            == len(committed) - 1   (all but the pending anchor)
    draft context cached + pending == len(committed) - 1
    anchor                          == committed[-1]
(the first two + 1 while a plain step has queued the next token's forward, see `_plain_step`).
The anchor sits at absolute position p = len(committed) - 1. DSpark slot j drafts position p+j+1;
z-lab DFlash slot i >= 1 drafts p+i (the drafter's `draft_hidden` hides that difference).
A lookup drafter (`engine/lookup.py`) reads no taps: its state is an n-gram index over `committed`
instead of a context cache, and a round where it finds no match is a plain decode step.
A hybrid drafter (`HybridDrafter`) has both states: each round `HybridScheduler` picks lookup, the
trained drafter or a plain step; every round's taps join the trained drafter's pending context,
whichever kind drafted it, so skipping its pass loses no context (docs/method.md §3.5).

Logit processors (penalties, logit bias, a grammar; `engine/processors.py`) act on every row a
distribution is formed from, each with the history plain decoding would have at that row's position.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

from engine import sampling
from engine.api import EngineCancelled, KindStats, SpecStats
from engine.grammar import CompiledGrammar
from engine.lookup import split_drafter
from engine.models.drafter import draft_base, draft_rows
from engine.models.target import Target, cache_length, fork_cache, trim_cache
from engine.prefix_cache import PrefixState, capture
from engine.processors import LogitProcessor, ProcessorSettings
from engine.samplers import Sampler
from engine.scheduler import HybridScheduler, Scheduler
from engine.seams import DrafterLike, drafter_kind
from engine.vision import PromptInputs

PREFILL_CHUNK = 512
# Pending context rows (taps the trained drafter has not absorbed) are absorbed into its context
# cache once this many pile up in rounds it skips (plain steps, lookup rounds), so that the pending
# array is not copied whole every round and the next draft pass does not absorb a long run at once.
ABSORB_ROWS = 64


@dataclass
class DecodeOptions:
    """Per-request decoding choices."""

    sampler: Sampler  # target draw, draft draw and accept rule (`engine.samplers.make_sampler`)
    stop_ids: frozenset[int]
    processors: ProcessorSettings = ProcessorSettings()  # penalties and logit bias (default: off)
    logprobs: int | None = None  # None: off; n: raw target logprob of each committed token + top n
    grammar: CompiledGrammar | None = None  # constrained decoding (each decoder starts its own matcher)


class SpecDecoder:
    """Decodes one request; `drafter=None` is baseline mode (plain target decoding).

    `drafter` is a trained drafter (`DrafterLike`), `engine.lookup.LookupDrafter`, or
    `engine.lookup.HybridDrafter` (both, with a `HybridScheduler`).

    Use: `prefill(prompt)` then `step(budget)` until `done`. `read_prompt` + `first_token` are
    prefill's two halves; between them `fork` gives decoders that share the prompt's forward pass
    but draw their own tokens (tests draw thousands of generations from one prompt this way).
    """

    def __init__(self, target: Target, drafter: DrafterLike | None, scheduler: Scheduler | None,
                 opts: DecodeOptions, stats: SpecStats):
        self.target, self.drafter, self.scheduler, self.opts, self.stats = target, drafter, scheduler, opts, stats
        self.sampler = opts.sampler
        self.committed: list[int] = []
        self.target_cache = target.make_cache()
        # "dspark", "dflash", "lookup", "dspark+lookup", "dflash+lookup"; None in baseline mode
        self.kind = drafter_kind(drafter)
        self._trained, self._lookup = split_drafter(drafter)
        self._hybrid = self._trained is not None and self._lookup is not None
        self._trained_kind = drafter_kind(self._trained)
        # The kind drafting the current round (a hybrid decoder sets it each round).
        self._round_kind = "lookup" if self._trained is None else self._trained_kind
        # Only trained drafters read the target's hidden states: lookup never builds or keeps taps.
        self._taps = self._trained is not None
        self.draft_cache = self._trained.make_cache() if self._trained is not None else None
        # Lookup's draft state is its n-gram index over `committed`, fed each committed token.
        self._index = self._lookup.make_cache() if self._lookup is not None else None
        self.ctx_pending: mx.array | None = None  # [1, c, m*d] taps not yet in the draft cache
        # The next plain step's (lazy token, raw logits row [V]), its forward queued.
        self._ahead: tuple[mx.array, mx.array] | None = None
        self._prompt_row: mx.array | None = None  # [V] the prompt's last logits, until first_token
        self.done = False
        vocab = target.vocab_size if opts.processors.active else 0  # no arrays when off
        grammar = opts.grammar.matcher(stats) if opts.grammar is not None else None
        self.processor = LogitProcessor(opts.processors, vocab, grammar)
        # Per token committed by the last prefill/step: (raw logprob, [(id, logprob)] top n); None: off.
        self.last_logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None
        # Of the tokens the last prefill/step committed, how many (the first ones) were accepted drafts.
        self.last_drafted = 0

    def committed_view(self) -> list[int]:
        """The live committed token list (prompt + generated); do not modify."""
        return self.committed

    # ------------------------------------------------------------------ prefill

    def prefill(self, prompt_ids: list[int], prefix: tuple[PrefixState, int] | None = None,
                cancelled: Callable[[], bool] | None = None, inputs: PromptInputs | None = None) -> list[int]:
        """Run the prompt through the target and commit the first token; returns [token].

        `prefix` (state, n): start from the first n prompt positions restored from a prefix-cache
        state (`PrefixCache.match`) and read only the rest. `cancelled` is polled between chunks.
        `inputs`: the prompt's embeddings when it holds images (engine/vision.py)."""
        t0 = time.perf_counter()
        self.read_prompt(prompt_ids, prefix, cancelled, inputs)
        new = self.first_token()
        self.stats.time_prefill_s += time.perf_counter() - t0
        return new

    def read_prompt(self, prompt_ids: list[int], prefix: tuple[PrefixState, int] | None = None,
                    cancelled: Callable[[], bool] | None = None, inputs: PromptInputs | None = None) -> None:
        """The prompt's target forward pass (in chunks), filling the caches; nothing is sampled.

        With `prefix` (state, n), positions 0..n-1 come from the state and only prompt_ids[n:] is
        read. Between chunks `cancelled()` may end the read with EngineCancelled; the decoder is
        then in a consistent state holding the chunks read (`capture` may keep them). A prompt with
        `inputs` (images) is read in one forward: image positions attend to each other both ways."""
        start = 0
        chunk = PREFILL_CHUNK if inputs is None else max(1, len(prompt_ids))
        if prefix is not None:
            start = self._restore(*prefix)
            self.stats.prompt_cached_tokens = start
        ids = mx.array(prompt_ids)[None]  # [1, P]
        taps = [self.ctx_pending] if self.ctx_pending is not None else []  # [1, c, m*d] each
        try:
            for begin in range(start, len(prompt_ids), chunk):
                if cancelled is not None and cancelled():
                    raise EngineCancelled("cancelled during prefill")
                logits, chunk_taps = self._forward(ids[:, begin : begin + chunk], inputs)
                last = logits[0, -1]  # [V]
                mx.eval(last, chunk_taps) if chunk_taps is not None else mx.eval(last)
                if chunk_taps is not None:
                    taps.append(chunk_taps)
                self.committed[:] = prompt_ids[: begin + chunk]  # the positions the caches hold
        finally:
            self.ctx_pending = (taps[0] if len(taps) == 1 else mx.concatenate(taps, axis=1)) if taps else None
        if self._index is not None:
            self._index.extend(prompt_ids)
        self.processor.add_prompt(prompt_ids)
        self._prompt_row = last

    def _restore(self, state: PrefixState, length: int) -> int:
        """Take positions 0..length-1 from a prefix-cache state; returns `length`."""
        if self.committed:
            raise RuntimeError("a prefix can only be restored into a fresh decoder")
        self.target_cache, draft_cache, self.ctx_pending = state.restore(length)
        if self._taps:
            self.draft_cache = draft_cache
        self.committed[:] = state.tokens[:length].tolist()
        return length

    def capture(self) -> PrefixState:
        """This decoder's committed state for the prefix cache (between rounds, or after a cancelled
        prefill): the positions its target cache holds and the drafter context that matches them."""
        held = cache_length(self.target_cache)
        draft = self.draft_cache if self._taps else None
        return capture(self.committed[:held], self.target_cache, draft, self.ctx_pending if self._taps else None)

    def first_token(self) -> list[int]:
        """Sample and commit the token after the prompt read by `read_prompt`; returns [token]."""
        row, self._prompt_row = self._prompt_row, None
        token = self._target_token(row, position=len(self.committed)).item()
        new = self._commit([token])
        self.last_logprobs = self._logprobs(row[None], new)
        return new

    def fork(self, opts: DecodeOptions, scheduler: Scheduler | None, stats: SpecStats) -> SpecDecoder:
        """A decoder in this one's state after `read_prompt` (caches copied) that samples with `opts`."""
        if self._prompt_row is None:
            raise RuntimeError("fork() is only possible between read_prompt() and first_token()")
        other = type(self)(self.target, self.drafter, scheduler, opts, stats)
        other.target_cache = [fork_cache(c) for c in self.target_cache]
        other.ctx_pending = self.ctx_pending  # MLX arrays are immutable: sharing is safe
        other.committed[:] = self.committed
        if self._index is not None:
            other._index = self._index.copy()
        other.processor.add_prompt(self.committed)
        other._prompt_row = self._prompt_row
        return other

    # ------------------------------------------------------------------ rounds

    def step(self, budget: int) -> list[int]:
        """One round committing at most `budget` >= 1 tokens; returns the committed tokens."""
        if self.drafter is None:
            return self._plain_step(queue_next=budget > 1)
        if self._hybrid:
            return self._hybrid_step(budget)
        if not self.scheduler.wants_draft():
            return self._plain_step(queue_next=self._queue_next(budget))
        if self._ahead is not None:
            # Queued because lookup could not match whatever the last token was: an empty round.
            if self._round_kind == "lookup":
                self._kind_stats().empty_rounds += 1
            return self._plain_step(queue_next=self._queue_next(budget))
        return self._round(budget)

    def _queue_next(self, budget: int) -> bool:
        """Whether a plain step (not in a hybrid) queues the next step's forward: when the next round
        is plain for sure, because the scheduler will skip it or lookup cannot find a match then."""
        if budget <= 1:
            return False
        if self.scheduler.next_is_plain():
            return True
        return self._round_kind == "lookup" and not self._index.may_match_next()

    def _hybrid_step(self, budget: int) -> list[int]:
        """A hybrid round: lookup drafts, the trained drafter, or a plain step, as `HybridScheduler`
        chooses from lookup's proposal and the estimates of past rounds (docs/method.md §6.5)."""
        scheduler: HybridScheduler = self.scheduler
        t0 = time.perf_counter()
        # A few dictionary look-ups: whether lookup has a match, and what it would draft.
        proposal = self._index.propose(self._lookup.config.max_drafts)
        # A plain step that the previous one already queued: no choice to make (a limit of 0 drafts
        # makes `choose` say plain without consulting, or changing, either scheduler).
        limit = 0 if self._ahead is not None else budget - 1
        choice = scheduler.choose(len(proposal), limit)
        if choice is None:
            new = self._plain_step(queue_next=budget > 1 and scheduler.next_is_plain())
        else:
            self._round_kind = "lookup" if choice == "lookup" else self._trained_kind
            new = self._round(budget, t0)
        scheduler.shadow(proposal, new)
        return new

    def _round(self, budget: int, t0: float | None = None) -> list[int]:
        """Draft with this round's kind, verify, accept, commit and roll back."""
        t0 = time.perf_counter() if t0 is None else t0
        draft_ids, draft_logprobs = self.draft(limit=budget - 1)
        t1 = time.perf_counter()
        if not draft_ids and self._round_kind == "lookup":
            return self._no_match_step(t1 - t0, budget)
        logits, taps = self._verify(draft_ids)
        t2 = time.perf_counter()
        num_accepted, token = self._accept(draft_ids, draft_logprobs, logits)
        t3 = time.perf_counter()
        new = self._commit(draft_ids[:num_accepted] + [token])
        self.last_drafted = min(num_accepted, len(new))  # a stop among the drafts may cut the round
        self.last_logprobs = self._logprobs(logits, new)  # row i of the verify pass scored new[i]
        # A stop token among the accepted drafts cuts `new` short: keep only what was committed.
        self._roll_back(len(draft_ids), len(new) - 1, taps)
        self._record(len(draft_ids), num_accepted, len(new), (t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t3))
        return new

    def _no_match_step(self, t_lookup: float, budget: int) -> list[int]:
        """Lookup found no match: a plain decode step, not a verify of an empty draft.

        Whether the next round finds a match usually depends on the token this step reads, so the
        next forward is queued only when the index proves that no token could give one."""
        self.stats.time_draft_s += t_lookup
        self._kind_stats().empty_rounds += 1
        return self._plain_step(queue_next=not self._hybrid and self._queue_next(budget))

    def _plain_step(self, queue_next: bool) -> list[int]:
        """A plain decode step: baseline mode, or a round `auto` decodes without the drafter.

        Pipelined as mlx-lm's generate is: when the next step is plain too (`queue_next`), its
        forward is queued from the still-lazy token before this token is read, so building that
        graph, detokenizing and streaming overlap this forward. The forwards and draws are those of
        reading each token first; a stop leaves the queued forward unused (the decoder is dropped).
        The queued row's processors see the current token as history while it is still lazy.
        """
        t0 = time.perf_counter()
        n = len(self.committed)
        queue_next = queue_next and not self.processor.reads_tokens  # a grammar needs the token first
        current, row = self._ahead or self._launch(mx.array([[self.committed[-1]]]), n)
        self._ahead = self._launch(current.reshape(1, 1), n + 1, pending=current.reshape(1)) if queue_next else None
        token = current.item()
        t1 = time.perf_counter()
        new = self._commit([token])
        self.last_drafted = 0
        self.last_logprobs = self._logprobs(row[None], new)
        self._record(0, 0, len(new), (0.0, t1 - t0, 0.0, time.perf_counter() - t1))
        return new

    def _launch(self, ids: mx.array, position: int, pending: mx.array | None = None) -> tuple[mx.array, mx.array]:
        """Queue the target forward of ids [1, 1] and the draw for `position` after it.

        Returns (lazy token, raw logits row [V]). `pending` [1] is a generated token not committed
        yet (lazy), part of the processors' history. In a speculative mode the forward's taps
        [1, 1, m*d] join the drafter's pending context."""
        logits, taps = self._forward(ids)  # [1, 1, V]
        row = logits[0, -1]  # [V]
        token = self._target_token(row, position, pending)
        if taps is None:
            mx.async_eval(token)
            return token, row
        mx.async_eval(token, taps)
        self._add_context(taps)
        return token, row

    def _add_context(self, taps: mx.array) -> None:
        """Queue taps [1, c, m*d] of newly committed positions for the trained drafter's context.

        They wait in `ctx_pending` until its next pass absorbs them; rounds it skips (plain steps,
        lookup rounds of a hybrid) keep adding, and every ABSORB_ROWS rows are absorbed into its
        context cache at once, so nothing is lost and nothing is recomputed."""
        self.ctx_pending = taps if self.ctx_pending is None else mx.concatenate([self.ctx_pending, taps], axis=1)
        if self.ctx_pending.shape[1] >= ABSORB_ROWS:
            self._trained.append_context(self.ctx_pending, self.draft_cache)
            self.ctx_pending = None

    def draft(self, limit: int) -> tuple[list[int], mx.array | None]:
        """This round's drafts: up to `limit` ids, and their log q [l, V] (None when the accept rule
        needs no q). A trained drafter samples them one by one (the Markov bias uses the *sampled*
        previous token); lookup copies them from the context (`_lookup_draft`). A hybrid decoder
        drafts with the kind its scheduler chose for the round."""
        if self._round_kind == "lookup":
            return self._lookup_draft(limit)
        anchor, p = self.committed[-1], len(self.committed) - 1
        drafter = self._trained
        cfg = drafter.config
        block = mx.array([[anchor] + [cfg.mask_token_id] * (cfg.block_size - 1)])  # [1, B]
        h = drafter.draft_hidden(drafter.backbone(self.ctx_pending, block, self.draft_cache))[0]  # [L, d]
        self.ctx_pending = None
        cap = min(limit, h.shape[0])
        self.scheduler.begin_round(cap)
        # Without confidence truncation the verified length is known now: one lm_head matmul over
        # exactly those rows. With it, rows are projected one by one as they are admitted.
        lazy = self._uses_confidence()
        base = None if lazy else draft_base(drafter, h[: self.scheduler.round_limit])  # [l, V] (shortlist: [l, S])
        maskable = self._draft_row_maskable()
        ids, logq_rows, prev = [], [], anchor
        for k in range(1, cap + 1):
            if not self.scheduler.admit(k, self._confidence(h, k, prev) if lazy else None):
                break
            # Lazy: this row's lm_head runs only now that it is admitted. The Markov bias needs the
            # sampled x_{k-1} (and h_k for gated heads), so it is added row by row in either path.
            # With a shortlist the row is -inf outside it (`draft_rows`: why that stays lossless).
            row = draft_rows(drafter, h[k - 1 : k], mx.array([prev]),
                             None if lazy else base[k - 1 : k])[0]  # [V]
            # Processed before sampling, so logq is exactly the q this draft is drawn from.
            row = self.processor.apply(row, ids)  # history: committed + drafts[:k-1]
            if maskable and _all_masked(row):
                break  # nothing to draw from: the round verifies the drafts so far (0 is a plain step)
            prev, logq = self.sampler.draft_token(row, position=p + k)
            ids.append(prev)
            logq_rows.append(logq)
        logq_all = mx.stack(logq_rows) if logq_rows and logq_rows[0] is not None else None
        return ids, logq_all

    def _lookup_draft(self, limit: int) -> tuple[list[int], mx.array | None]:
        """Tokens copied after the latest earlier occurrence of the context's last n tokens, at most
        the round's cap, with their point-mass log q [l, V] (docs/method.md §5.6); ([], None): no match.

        The proposal is a function of the committed tokens alone (no random draw), so cutting it at
        the scheduler's cap cannot look ahead at a sample (docs/method.md §6.1)."""
        self.scheduler.begin_round(min(limit, self._lookup.config.max_drafts))
        ids: list[int] = []
        for k, token in enumerate(self._index.propose(self.scheduler.round_limit), start=1):
            if not self.scheduler.admit(k, None):
                break
            ids.append(token)
        return ids, (self.sampler.point_mass(ids, self.target.vocab_size) if ids else None)

    def _draft_row_maskable(self) -> bool:
        """Whether a processed draft row can be -inf everywhere: a grammar can forbid every token of a
        shortlist drafter's row (a whole-vocabulary row always keeps the tokens the grammar allows)."""
        return self.processor.grammar is not None and getattr(self._trained, "shortlist", None) is not None

    def _uses_confidence(self) -> bool:
        return self.scheduler.uses_confidence and self._trained.has_confidence

    def _confidence(self, h: mx.array, k: int, prev: int) -> float:
        """c_k = sigmoid(z_k / t_k); depends on h_k and x_{k-1} only (never on x_k)."""
        z = self._trained.confidence_logits(h[k - 1 : k], mx.array([prev])).item()
        temps = self._trained.config.sts_temperatures
        t = temps[k - 1] if temps and k - 1 < len(temps) else 1.0
        return 1.0 / (1.0 + math.exp(-z / t))

    def _verify(self, draft_ids: list[int]) -> tuple[mx.array, mx.array | None]:
        """One target forward over [anchor, x_1..x_l]: logits [l+1, V], taps [1, l+1, m*d] (None without a
        trained drafter)."""
        ids = mx.array([[self.committed[-1]] + draft_ids])  # [1, l+1]
        logits, taps = self._forward(ids)
        mx.eval(logits, taps) if taps is not None else mx.eval(logits)
        return logits[0], taps

    def _forward(self, ids: mx.array, inputs: PromptInputs | None = None) -> tuple[mx.array, mx.array | None]:
        """Target forward of ids [1, n] on this request's cache: logits [1, n, V] and, for a trained
        drafter, taps [1, n, m*d]; else None (lookup and baseline ask the target for none at all)."""
        return self.target.forward(ids, self.target_cache, taps=self._taps, inputs=inputs)

    def _accept(self, draft_ids: list[int], draft_logprobs, logits: mx.array) -> tuple[int, int]:
        x = self.processor.apply_rows(logits, draft_ids)  # [l+1, V] row k: committed + drafts[:k]
        return self.sampler.accept(draft_ids, draft_logprobs, x, anchor=len(self.committed) - 1)

    def _roll_back(self, num_draft: int, num_kept: int, taps: mx.array | None) -> None:
        """Keep anchor + the `num_kept` committed drafts' rows in the target cache; their taps (if any)
        join the trained drafter's pending context (after any rows a hybrid's lookup rounds left
        there). Lookup needs nothing rolled back: its index only ever holds committed tokens."""
        trim_cache(self.target_cache, num_draft - num_kept)
        if taps is not None:
            self._add_context(taps[:, : num_kept + 1])

    # ------------------------------------------------------------------ sampling helpers

    def _target_token(self, logits: mx.array, position: int, pending: mx.array | None = None) -> mx.array:
        """The plain target draw for `position` as a lazy scalar (not yet evaluated).

        logits [V]; the processors' history is the committed tokens plus `pending` [1] if given."""
        return self.sampler.target_token(self.processor.apply(logits, pending), position)

    # ------------------------------------------------------------------ bookkeeping

    def _commit(self, tokens: list[int]) -> list[int]:
        """Append tokens, cutting after the first stop/EOS id (no token after it)."""
        for i, tok in enumerate(tokens):
            if tok in self.opts.stop_ids:
                tokens = tokens[: i + 1]
                self.done = True
                break
        self.committed.extend(tokens)
        self.processor.commit(tokens)  # only committed tokens: rolled-back drafts never count
        if self._index is not None:
            self._index.extend(tokens)  # likewise: drafts enter the index only once committed
        self.stats.generated_tokens += len(tokens)
        return tokens

    def _logprobs(self, rows: mx.array, tokens: list[int]) -> list[tuple[float, list[tuple[int, float]]]] | None:
        """Raw target logprobs of the committed `tokens`, row i of rows [>= m, V] scoring tokens[i].

        Always the target's rows (never the drafter's), before processors: for a recovered token
        this is the target's log p(token), not the residual. None (nothing computed) when off.
        """
        if self.opts.logprobs is None:
            return None
        return sampling.token_logprobs(rows[: len(tokens)], tokens, self.opts.logprobs)

    def _record(self, num_draft: int, num_accepted: int, num_new: int, times: tuple[float, ...]) -> None:
        # times: (draft, verify, accept rule, other = commit + cache roll-back)
        st, (t_draft, t_verify, t_accept, t_other) = self.stats, times
        st.rounds += 1
        st.round_tokens += num_new
        st.drafted_tokens += num_draft
        st.accepted_tokens += num_accepted
        for i in range(num_draft):
            while len(st.verified_by_position) <= i:
                st.verified_by_position.append(0)
                st.accepted_by_position.append(0)
            st.verified_by_position[i] += 1
            st.accepted_by_position[i] += int(i < num_accepted)
        st.time_draft_s += t_draft
        st.time_verify_s += t_verify
        st.time_accept_s += t_accept
        st.time_other_s += t_other
        if num_draft:
            kind = self._kind_stats()
            kind.rounds += 1
            kind.drafted_tokens += num_draft
            kind.accepted_tokens += num_accepted
            if self._round_kind == "lookup" and self._index.last_source == "history":
                kind.history_rounds += 1
                kind.history_accepted_tokens += num_accepted
        if self.scheduler is not None:
            self.scheduler.observe(num_draft, num_accepted)

    def _kind_stats(self) -> KindStats:
        """This request's counters for the kind that drafted this round (created on first use)."""
        return self.stats.by_kind.setdefault(self._round_kind, KindStats())

    def check_invariants(self) -> None:
        """Assert the round bookkeeping invariants (used by tests after every round)."""
        n = len(self.committed)
        queued = int(self._ahead is not None)  # a queued forward is cached (and its taps pending)
        assert cache_length(self.target_cache) == n - 1 + queued, (cache_length(self.target_cache), n, queued)
        if self._index is not None:
            assert self._index.tokens == self.committed
        if not self._taps:
            assert self.ctx_pending is None
        else:
            pending = 0 if self.ctx_pending is None else self.ctx_pending.shape[1]
            assert self._trained.context_length(self.draft_cache) + pending == n - 1 + queued


def _all_masked(row: mx.array) -> bool:
    """True when the processed draft row [V] allows no token (every entry -inf).

    Stopping the draft there is lossless: the decision depends on the history before draft k, not
    on a draw from it, like the scheduler's cut (docs/method.md §3.6). Drawing from such a row would
    instead give NaN log-probabilities (greedy: a forbidden argmax the grammar refuses later)."""
    return mx.max(row).item() == float("-inf")
