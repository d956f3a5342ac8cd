"""Which token windows each rank trains and validates on, step by step (deterministic)."""

from __future__ import annotations

import numpy as np


class Sampler:
    """Deterministic, rank-sliced batches of fixed-length windows of the token stream.

    The stream is cut into ``n_seqs`` non-overlapping windows of ``seq_len + 1`` tokens. Each
    epoch visits them in a permutation drawn from ``(seed, epoch)``. One optimizer step takes the
    next ``G = world * batch * grad_accum`` windows; micro-step ``m`` of rank ``r`` gets windows
    ``[m*world*batch + r*batch, ... + batch)`` of them. The set of windows in a step depends only
    on G, so 2 ranks x batch B, 1 rank x batch 2B and 1 rank x batch B x grad_accum 2 see the
    same data. The position is (epoch, windows consumed in the epoch): resuming at another
    world size continues from the same window.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, batch: int, world: int, rank: int,
                 grad_accum: int, seed: int):
        self.tokens, self.seq_len, self.batch = tokens, seq_len, batch
        self.world, self.rank, self.grad_accum, self.seed = world, rank, grad_accum, seed
        self.n_seqs = (len(tokens) - 1) // seq_len
        self.global_batch = world * batch * grad_accum
        self.steps_per_epoch = self.n_seqs // self.global_batch
        self.epoch, self.offset = 0, 0
        self._perm_epoch, self._perm = -1, np.empty(0, dtype=np.int64)

    def state(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state(self, state: dict) -> None:
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])

    def _permutation(self) -> np.ndarray:
        if self._perm_epoch != self.epoch:
            rng = np.random.default_rng([self.seed, self.epoch])
            self._perm, self._perm_epoch = rng.permutation(self.n_seqs), self.epoch
        return self._perm

    def next_step(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """This rank's (inputs, targets) int64 arrays for each micro-step of the next step."""
        if self.offset + self.global_batch > self.n_seqs:
            self.epoch, self.offset = self.epoch + 1, 0
        chosen = self._permutation()[self.offset: self.offset + self.global_batch]
        self.offset += self.global_batch
        micro = []
        for m in range(self.grad_accum):
            first = m * self.world * self.batch + self.rank * self.batch
            micro.append(self.windows(chosen[first: first + self.batch]))
        return micro

    def windows(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = np.stack([np.asarray(self.tokens[i * self.seq_len: (i + 1) * self.seq_len + 1])
                         for i in indices]).astype(np.int64)
        return np.ascontiguousarray(rows[:, :-1]), np.ascontiguousarray(rows[:, 1:])

    def val_batches(self, steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Validation: batch k of rank r is windows k*world*batch + r*batch + j (mod n_seqs)."""
        out = []
        for k in range(steps):
            first = k * self.world * self.batch + self.rank * self.batch
            out.append(self.windows(np.arange(first, first + self.batch) % self.n_seqs))
        return out
