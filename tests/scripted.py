"""A scripted model pair: drafter and verifier both put all their mass on the next
token of a fixed script, so strict accepts every draft and the tokens are known.
Implements the batch protocol (``relaxtune.backends.base.Backend``) and, for
``relaxtune.backends.rows.RowByRow``, the one-sequence helpers."""

from __future__ import annotations

import torch

from relaxtune.backends.base import Batch, DraftResult, SequenceState

SURE = 100.0  # a logit that makes the softmax exactly one-hot in float32


class CharTokenizer:
    """Tokens are strings of the vocabulary; ``encode`` matches the longest first."""

    def __init__(self, vocab: list[str]) -> None:
        self.vocab = vocab

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(self.vocab[i] for i in ids)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = []
        while text:
            i = max((i for i, t in enumerate(self.vocab) if t and text.startswith(t)), key=lambda i: len(self.vocab[i]))
            ids.append(i)
            text = text[len(self.vocab[i]) :]
        return ids


class ScriptedBackend:
    """Generates ``script`` (token strings) after any prompt; ``eos`` names EOS tokens,
    ``extra`` more tokens (for text the caller encodes)."""

    point_mass_drafts = False
    native = None

    def __init__(
        self, script: list[str], eos: tuple[str, ...] = (), batch_size: int = 4, extra: tuple[str, ...] = ()
    ) -> None:
        self.vocab = sorted(set(script) | set(eos) | set(extra) | {"?"})
        self.script = [self.vocab.index(t) for t in script]
        self.tokenizer = CharTokenizer(self.vocab)
        self.vocab_size = len(self.vocab)
        self.eos_token_ids = frozenset(self.vocab.index(t) for t in eos)
        self.name, self.batch_size = "scripted", batch_size

    def _row(self, position: int) -> torch.Tensor:
        row = torch.zeros(self.vocab_size)
        nxt = self.script[position] if position < len(self.script) else self.vocab.index("?")
        row[nxt] = SURE
        return row

    # one sequence
    def start(self, prompt_ids) -> SequenceState:
        return SequenceState(tokens=list(prompt_ids), prompt_len=len(prompt_ids))

    def draft(self, state, n, pick, extra_step=False) -> DraftResult:
        done, ids, rows = len(state.generated), [], []
        for i in range(n + int(extra_step)):
            rows.append(self._row(done + i))
            if i < n:
                ids.append(int(pick(rows[-1])))
        state.draft_forwards += n + int(extra_step)
        return DraftResult(ids, torch.stack(rows))

    def score(self, state, draft_ids) -> torch.Tensor:
        state.verify_forwards += 1
        return torch.stack([self._row(len(state.generated) + i) for i in range(len(draft_ids) + 1)])

    def step(self, state) -> torch.Tensor:
        return self.score(state, [])[0]

    def commit(self, state, tokens) -> None:
        state.tokens.extend(int(t) for t in tokens)

    def decode(self, ids) -> str:
        return self.tokenizer.decode(ids)

    # a batch
    def start_batch(self) -> Batch:
        return Batch()

    def join(self, batch, prompts):
        states = [self.start(p) for p in prompts]
        batch.states.extend(states)
        return states

    def leave(self, batch, rows) -> None:
        batch.states = [s for i, s in enumerate(batch.states) if i not in set(rows)]

    def draft_batch(self, batch, n, pick, extra_step=False):
        rows = torch.stack(
            [torch.stack([self._row(len(s.generated) + i) for i in range(n + int(extra_step))]) for s in batch.states]
        )
        ids = torch.stack([pick(rows[:, i], i) for i in range(n)], 1)
        return ids, rows

    def score_batch(self, batch, draft_ids) -> torch.Tensor:
        return torch.stack([self.score(s, d) for s, d in zip(batch.states, draft_ids.tolist())])

    def commit_batch(self, batch, tokens) -> None:
        for s, t in zip(batch.states, tokens):
            self.commit(s, t)
