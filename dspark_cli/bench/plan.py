"""What a benchmark run measures: modes, caps, prompts, tokens and repeats (`--quick` or full)."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class BenchPlan:
    """The measured grid of one `dspark bench` run."""

    modes: tuple[str, ...] = ("dspark", "dflash")  # speculative modes timed against baseline
    caps: tuple[int, ...] | None = None  # fixed caps; None: 1..max drafts (thinned to cap_budget)
    cap_budget: int | None = None  # time at most this many fixed caps (always 1 and the largest)
    per_kind: int | None = None  # prompts per kind; None = the whole set
    max_tokens: int = 128
    repeats: int = 2  # timed passes over all arms per prompt, alternating order (A B ... B A)
    mlx_lm: bool = True  # include mlx_lm's own generate on the same target as external reference
    warmup_tokens: int = 8  # one untimed short run per arm first (allocation, kernel set-up)

    def caps_for(self, max_drafts: int) -> list[int]:
        """The fixed caps to time for a drafter that drafts at most `max_drafts` tokens."""
        if self.caps is not None:
            return sorted({min(max(1, c), max_drafts) for c in self.caps})
        caps = list(range(1, max_drafts + 1))
        n = self.cap_budget
        if n is None or n >= len(caps):
            return caps
        if n <= 1:
            return [max_drafts]
        # Evenly spread, keeping both ends: the cheapest round and the full block.
        return sorted({caps[round(i * (len(caps) - 1) / (n - 1))] for i in range(n)})

    def with_overrides(self, **kw) -> BenchPlan:
        """A copy with the given fields replaced (None values are ignored)."""
        return replace(self, **{k: v for k, v in kw.items() if v is not None})


# Sized for under 10 minutes on the project's 2-core CPU with SmolLM2-135M (see docs/performance.md):
# 3 prompts (one per kind) x 2 passes x (baseline + 2 modes x (3 caps + auto) + mlx-lm) x 48 tokens.
QUICK = BenchPlan(per_kind=1, max_tokens=48, repeats=2, cap_budget=3)
FULL = BenchPlan(per_kind=None, max_tokens=128, repeats=2)
