"""Draft-length schedulers: how many drafts a round verifies.

Every scheduler is non-anticipating (DSpark paper, App. A): the decision to verify draft k is made
before x_k is sampled, from c_1..c_k (which depend only on x_0..x_{k-1}) and from state fixed at
the start of the round. That is what keeps variable-length rounds lossless.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Acceptance assumed at every position before a request has finished any round.
AUTO_PRIOR = 0.6
# While the estimates say no round can beat a plain decode step, `auto` skips the drafter entirely
# and probes with one draft every PROBE_EVERY rounds so that the estimates can recover.
PROBE_EVERY = 16
# The prior counts as this many observed rounds: a position's first outcomes move its estimate as a
# running mean would (1/5, 1/6, ...), later ones by the EMA weight, so a short request leaves a
# prior that does not fit its drafter within a few rounds and a long one still follows drift.
PRIOR_ROUNDS = 4
# Lookup's acceptance comes in runs (whole copied lines accepted, then nothing), so its estimate
# must follow the last few rounds: each round's evidence decays by this much per later round.
# Chosen on a synthetic run model (copy runs and non-copy stretches of 5..200 tokens), where it
# matched the +2/-1 adaptive cap of the study in docs/lookup.md on copy-heavy text and did not lose
# on text that does not copy; the copy-heavy bench (issue 24, part 5) is where it gets tuned.
LOOKUP_DECAY = 0.25


class Scheduler:
    """Base: a fixed cap. `begin_round(limit)` then `admit(k, c_k)` for k = 1, 2, ..."""

    uses_confidence = False

    def __init__(self, cap: int):
        self.cap = cap
        self._limit = cap

    def wants_draft(self) -> bool:
        """Run the drafter this round? False means a plain decode step (decided from past rounds only)."""
        return True

    def next_is_plain(self) -> bool:
        """Asked during a plain step: will the next `wants_draft` say no? (Only `auto` skips.)"""
        return False

    def begin_round(self, limit: int) -> None:
        """Start a round that may verify at most min(cap, limit) drafts."""
        self._limit = max(0, min(self.cap, limit))

    def admit(self, k: int, confidence: float | None) -> bool:
        """Verify draft k (1-based)? `confidence` is c_k, known before x_k is sampled."""
        return k <= self._limit

    @property
    def round_limit(self) -> int:
        """Most drafts this round can admit, known at its start."""
        return self._limit

    def observe(self, num_verified: int, num_accepted: int) -> None:
        """Learn from a finished round (only schedulers with estimates use it)."""


class ThresholdScheduler(Scheduler):
    """Keep drafting while the prefix survival a_k = prod c_i stays >= theta (mlx-dspark's rule)."""

    uses_confidence = True

    def __init__(self, cap: int, theta: float):
        super().__init__(cap)
        self.theta = theta
        self._survival = 1.0

    def begin_round(self, limit: int) -> None:
        super().begin_round(limit)
        self._survival = 1.0

    def admit(self, k: int, confidence: float | None) -> bool:
        if k > self._limit:
            return False
        self._survival *= 1.0 if confidence is None else confidence
        return self._survival >= self.theta


def expected_tokens(acceptance: list[float], num_draft: int) -> float:
    """Expected tokens committed by a round verifying `num_draft` drafts: 1 + sum_j prod_{i<=j} acc_i.

    `acceptance` holds conditional per-position rates (P(draft i kept | drafts < i kept)); the 1 is
    the recovered or bonus token every round commits (DSpark paper, Eq. 1 and section 3.2).
    """
    survival, total = 1.0, 1.0
    for i in range(num_draft):
        survival *= acceptance[i] if i < len(acceptance) else 0.0
        total += survival
    return total


@dataclass
class CostCurve:
    """Measured wall time of a round that verifies l drafts: draft(l) + verify(l + 1).

    This is the performance model `auto` optimises: predicted speedup over plain decoding is
    expected tokens per round / (round time relative to one plain decode step).
    """

    verify_s: list[float]  # [i] = time of a target forward over i + 1 tokens
    draft_fixed_s: float  # backbone pass (independent of l)
    draft_per_token_s: float  # lm_head + Markov + sampling per drafted position
    meta: dict = field(default_factory=dict)
    decode_threads: int | None = None  # BLAS threads the curve was timed at (None: left as loaded)
    plain_step_s: float | None = None  # a pipelined plain decode step (None: verify_s[0])

    def round_time(self, num_draft: int) -> float:
        """Predicted seconds for a round verifying `num_draft` drafts (0 = plain decode step).

        A plain step is pipelined (the next forward is queued before the token is read, see
        `SpecDecoder._plain_step`), so it costs less than a lone one-token forward when measured.
        """
        if num_draft == 0 and self.plain_step_s is not None:
            return self.plain_step_s
        i = min(num_draft, len(self.verify_s) - 1)
        draft = self.draft_fixed_s + self.draft_per_token_s * num_draft if num_draft else 0.0
        return self.verify_s[i] + draft

    def relative_round_time(self, num_draft: int) -> float:
        """Round time in units of one plain decode step, T(l) / T(0)."""
        return self.round_time(num_draft) / self.round_time(0)

    def predicted_speedup(self, acceptance: list[float], num_draft: int) -> float:
        """Predicted decode speedup over plain decoding at a fixed number of verified drafts."""
        return expected_tokens(acceptance, num_draft) / self.relative_round_time(num_draft)

    def ceiling(self, num_draft: int) -> float:
        """Speedup if every draft were accepted: (l + 1) / (T(l) / T(0)); no drafter can beat it."""
        return (num_draft + 1) / self.relative_round_time(num_draft)

    def best_cap(self, acceptance: list[float], max_cap: int) -> tuple[int, float]:
        """Cap maximising expected tokens/s for conditional acceptance rates; (cap, tokens/s)."""
        best, best_rate = 0, 1.0 / self.round_time(0)
        for num in range(1, max_cap + 1):
            rate = expected_tokens(acceptance, num) / self.round_time(num)
            if rate > best_rate:
                best, best_rate = num, rate
        return best, best_rate


class AutoScheduler(Scheduler):
    """The R = 1 form of DSpark's Algorithm 1 on a measured cost curve T(l).

    With a confidence head it scans l = 1, 2, ... on the live prefix survival a_l and stops at the
    first l whose expected throughput (1 + sum a_j) / T(l) does not improve (the early stop is what
    keeps it lossless). Without one it uses per-position acceptance rates estimated from earlier
    rounds, fixed at the start of the round, so it is non-anticipating too.
    """

    def __init__(self, cap: int, curve: CostCurve, use_confidence: bool, prior: float = AUTO_PRIOR):
        super().__init__(cap)
        self.curve = curve
        self.uses_confidence = use_confidence
        self.acceptance = [prior] * cap  # running estimate per position
        self._round_cap = cap
        self._survival, self._expected, self._best_rate = 1.0, 1.0, 0.0
        self._skipped, self._probing = 0, False
        self._round_conf: list[float] = []  # c_1, c_2, ... seen this round
        self._seen = [0] * cap  # outcomes observed per position

    def next_is_plain(self) -> bool:
        """Whether the next `wants_draft` will say no, asked during a skipped round (which leaves the
        estimates as they are), so the decoder can queue that plain step's forward early."""
        return self.curve.best_cap(self.acceptance, self.cap)[0] == 0 and self._skipped + 1 < PROBE_EVERY

    def wants_draft(self) -> bool:
        """No while the model's best cap on the running estimates is 0, except one probe round in
        PROBE_EVERY (which verifies at least one draft). Even with a confidence head this saves the
        drafter's backbone pass, about 0.2 of a decode step, on rounds that would draft nothing."""
        self._round_conf = []
        if self.curve.best_cap(self.acceptance, self.cap)[0] > 0:
            self._skipped, self._probing = 0, False
            return True
        self._skipped += 1
        self._probing = self._skipped >= PROBE_EVERY
        if self._probing:
            self._skipped = 0
        return self._probing

    def begin_round(self, limit: int) -> None:
        super().begin_round(limit)
        self._survival, self._expected = 1.0, 1.0
        self._best_rate = 1.0 / self.curve.round_time(0)
        if not self.uses_confidence:
            self._round_cap = min(self._limit, self.curve.best_cap(self.acceptance, self.cap)[0])
            if self._probing:
                self._round_cap = min(self._limit, max(self._round_cap, 1))

    def admit(self, k: int, confidence: float | None) -> bool:
        if k > self._limit:
            return False
        if not self.uses_confidence or confidence is None:
            return k <= self._round_cap
        self._round_conf.append(confidence)
        self._survival *= confidence
        self._expected += self._survival
        rate = self._expected / self.curve.round_time(k)
        if rate <= self._best_rate and not (self._probing and k == 1):
            return False  # early stop: never look further once throughput stops improving
        self._best_rate = max(rate, self._best_rate)
        return True

    @property
    def round_limit(self) -> int:
        return self._limit if self.uses_confidence else self._round_cap

    def observe(self, num_verified: int, num_accepted: int, weight: float = 0.05) -> None:
        """Update the per-position acceptance estimates after a round (EMA).

        Verified positions count as hits or a miss. When the confidence head stopped the round, the
        first unverified draft's confidence (a calibrated estimate of the same conditional rate)
        stands in for its outcome; otherwise rounds that admit nothing would leave the estimates,
        and so `wants_draft`, stuck at the prior.
        """
        for i in range(min(num_verified, self.cap)):
            hit = 1.0 if i < num_accepted else 0.0
            self._update(i, hit, weight)
            if not hit:
                return
        i = num_verified
        if i < min(len(self._round_conf), self.cap):
            self._update(i, self._round_conf[i], weight)

    def _update(self, i: int, value: float, weight: float) -> None:
        # Running mean with the prior as PRIOR_ROUNDS pseudo-observations, then an EMA of `weight`.
        step = max(weight, 1.0 / (self._seen[i] + PRIOR_ROUNDS + 1))
        self._seen[i] += 1
        self.acceptance[i] += step * (value - self.acceptance[i])

    @property
    def expected_cap(self) -> int:
        """The cap the cost model currently prefers (for reporting)."""
        return self.curve.best_cap(self.acceptance, self.cap)[0]


class LookupScheduler(AutoScheduler):
    """`auto` for lookup drafts: one acceptance rate for every draft position, from recent rounds.

    Lookup's acceptance comes in runs: a copied line is accepted token after token until the copy
    ends. Its conditional acceptance hardly depends on the position in the round, and only the last
    few rounds say whether a run is on. So the rate is the maximum-likelihood estimate of a constant
    per-token rate, accepted / (accepted + rejected) drafts, with each round's counts decaying by
    LOOKUP_DECAY per later round and the prior counting as PRIOR_ROUNDS drafts. (Per-position
    estimates would never learn the positions beyond the cap they start with.) Each round's cap is
    the curve's best at that rate, fixed at the round's start, so it is non-anticipating; skipping
    and probing work as in `AutoScheduler`. Rounds without a match verify nothing and teach nothing.
    """

    def __init__(self, cap: int, curve: CostCurve, prior: float = AUTO_PRIOR, decay: float = LOOKUP_DECAY):
        super().__init__(cap, curve, use_confidence=False, prior=prior)
        self.decay = decay
        self._accepted, self._rejected = prior * PRIOR_ROUNDS, (1.0 - prior) * PRIOR_ROUNDS

    @property
    def rate(self) -> float:
        """The estimated probability that a drafted token is accepted, given the ones before it were."""
        return self._accepted / (self._accepted + self._rejected)

    def observe(self, num_verified: int, num_accepted: int) -> None:
        """Add a round's accepted drafts and its rejection (if any) to the decayed counts."""
        if num_verified == 0:
            return
        keep = 1.0 - self.decay
        self._accepted = keep * self._accepted + num_accepted
        self._rejected = keep * self._rejected + float(num_accepted < num_verified)
        self.acceptance = [self.rate] * self.cap


class HybridScheduler(Scheduler):
    """`hybrid` mode: per round, lookup drafts, the trained drafter, or a plain step, whichever the
    measured curve expects to commit the most tokens per second (docs/method.md §6.5).

    The trained drafter's rate is its `AutoScheduler` estimate at the best cap on a round costing
    verify(l + 1) + draft_fixed + draft_per_token * l; lookup's is its `LookupScheduler` rate at the
    best cap on verify(l + 1) alone (no draft cost), only when lookup has a match. Both are fixed
    before anything of the round is drawn, so the choice is non-anticipating (docs/method.md §6.1).
    The chosen scheduler then runs the round (`begin_round`, `admit`, `observe` are delegated).

    Lookup also learns from rounds it did not draft (`shadow`): its would-be drafts are compared with
    the committed tokens. For a point-mass draft x the accept probability is p(x), the probability
    that the committed token, an exact sample of p, equals x (and at greedy, or with seed-stable
    noise, the committed token is exactly what verification would have accepted), so the comparison
    is as good as a verified lookup round. That lets lookup win back rounds when a copy starts.
    """

    def __init__(self, trained: AutoScheduler, lookup: LookupScheduler):
        super().__init__(max(trained.cap, lookup.cap))
        self.trained, self.lookup = trained, lookup
        self.active: Scheduler | None = None  # the scheduler running this round; None: a plain step

    @property
    def uses_confidence(self) -> bool:  # type: ignore[override]
        return self.active is not None and self.active.uses_confidence

    def choose(self, matched: int, limit: int) -> str | None:
        """This round's drafter: "lookup", "trained", or None for a plain step. `matched` is the
        length of lookup's proposal (0: no match), `limit` the most drafts the budget allows."""
        self.active = None
        if limit < 1:
            return None
        use_trained = self.trained.wants_draft()  # past rounds only; its skip and probe rhythm
        plain_rate = 1.0 / self.trained.curve.round_time(0)
        trained_rate = self.trained.curve.best_cap(self.trained.acceptance, min(self.trained.cap, limit))[1]
        lookup_rate = 0.0
        if matched:
            lookup_rate = self.lookup.curve.best_cap(self.lookup.acceptance, min(self.lookup.cap, limit, matched))[1]
        if lookup_rate > max(plain_rate, trained_rate if use_trained else 0.0):
            self.active = self.lookup
            return "lookup"
        if use_trained:
            self.active = self.trained
            return "trained"
        return None

    def next_is_plain(self) -> bool:
        """The next round is plain whatever lookup finds: the trained drafter skips it and lookup's
        rate beats no plain step at any cap."""
        return self.trained.next_is_plain() and self.lookup.curve.best_cap(self.lookup.acceptance, self.lookup.cap)[0] == 0

    def begin_round(self, limit: int) -> None:
        self.active.begin_round(limit)

    def admit(self, k: int, confidence: float | None) -> bool:
        return self.active.admit(k, confidence)

    @property
    def round_limit(self) -> int:
        return self.active.round_limit if self.active is not None else 0

    def observe(self, num_verified: int, num_accepted: int) -> None:
        if self.active is not None:
            self.active.observe(num_verified, num_accepted)

    def shadow(self, proposal: list[int], committed: list[int]) -> None:
        """Teach lookup from a round it did not draft: `proposal` its drafts at the round's start,
        `committed` the round's tokens. Drafts agreeing with the committed tokens count as accepted;
        the first disagreement as a rejection; past the committed tokens nothing is known."""
        if not proposal or self.active is self.lookup:
            return
        agree = 0
        while agree < min(len(proposal), len(committed)) and proposal[agree] == committed[agree]:
            agree += 1
        rejected = agree < min(len(proposal), len(committed))
        self.lookup.observe(agree + int(rejected), agree)
