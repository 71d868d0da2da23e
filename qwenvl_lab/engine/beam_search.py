"""Notebook 06 — beam search: k beams a request, transformers' semantics (2k candidates, length penalty, early stop)."""

import torch
import torch.nn.functional as F

from ..checks.values import is_number

PENALTY = -1.0e9  # score that keeps a candidate out (what transformers adds)


class BeamSearch:
    """Beam state of B requests × k beams: running beams, finished hypotheses, and the early-stop test."""

    def __init__(
        self,
        batch_size: int,
        num_beams: int,
        max_new_tokens: int,
        end_id: int,
        pad_id: int,
        length_penalty: float = 1.0,
        early_stopping=False,
        device="cpu",
    ):
        if early_stopping not in (True, False, "never"):
            raise ValueError(f'early_stopping must be True, False or "never", got {early_stopping!r}')
        if not is_number(length_penalty):
            raise ValueError(f"length_penalty must be a number, got {length_penalty!r}")
        b, k = batch_size, num_beams
        self.k, self.max_new_tokens, self.end_id = k, max_new_tokens, end_id
        self.length_penalty, self.early_stopping = length_penalty, early_stopping
        self.candidates = 2 * k  # enough that k beams survive even if k candidates end
        self.top_k_mask = torch.arange(self.candidates, device=device) < k  # [2k]: only these may finish
        self.row_offset = torch.arange(b, device=device)[:, None] * k  # [B, 1]
        self.running = torch.full((b, k, max_new_tokens), pad_id, dtype=torch.long, device=device)  # generated ids
        self.running_scores = torch.zeros(b, k, device=device)
        self.running_scores[:, 1:] = PENALTY  # the k beams start identical: expand only the first
        self.sequences = self.running.clone()  # finished hypotheses, best first
        self.scores = torch.full((b, k), PENALTY, device=device)
        self.lengths = torch.zeros(b, k, dtype=torch.long, device=device)
        self.finished = torch.zeros(b, k, dtype=torch.bool, device=device)
        self.improvable = torch.ones(b, 1, dtype=torch.bool, device=device)  # can a running beam still beat them?

    def step(self, logits: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """Extend the beams by token t from logits [B·k, V]: (new beams' source rows [B·k], their tokens [B·k], done)."""
        b, k = self.running.shape[:2]
        vocab = logits.shape[-1]
        log_probs = F.log_softmax(logits.float(), dim=-1).view(b, k, vocab) + self.running_scores[:, :, None]
        top_scores, top_index = torch.topk(log_probs.view(b, k * vocab), self.candidates)  # [B, 2k]
        beam, token = top_index // vocab, top_index % vocab
        candidates = torch.take_along_dim(self.running, beam[:, :, None], dim=1)  # [B, 2k, max_new]
        candidates[:, :, t] = token
        ends = (token == self.end_id) | (t + 1 >= self.max_new_tokens)  # [B, 2k]

        running_scores = top_scores + ends.to(torch.float32) * PENALTY  # ended candidates stop running
        keep = torch.topk(running_scores, k).indices  # [B, k]
        self.running = torch.take_along_dim(candidates, keep[:, :, None], dim=1)
        self.running_scores = torch.take_along_dim(running_scores, keep, dim=1)
        src_rows = torch.take_along_dim(beam, keep, dim=1) + self.row_offset  # [B, k]

        self._add_finished(candidates, top_scores, ends, t)
        self._update_improvable(t + 1)
        done = not bool(self.improvable.any() & ~(self.finished.all() & (self.early_stopping is True)) & ~ends.all())
        return src_rows.view(-1), self.running[:, :, t].reshape(-1), done

    def _add_finished(self, candidates, top_scores, ends, t: int) -> None:
        """Merge the candidates that just ended (among the best k) into the k best finished hypotheses."""
        just_ended = ends & self.top_k_mask[None, :]
        scores = top_scores / ((t + 1) ** self.length_penalty)
        full = self.finished.all(dim=-1, keepdim=True) & (self.early_stopping is True)
        scores += full.to(torch.float32) * PENALTY
        scores += (~self.improvable).to(torch.float32) * PENALTY
        scores += (~just_ended) * PENALTY
        merged_scores = torch.cat([self.scores, scores], dim=1)  # [B, 3k]
        best = torch.topk(merged_scores, self.k).indices  # [B, k]
        self.sequences = torch.take_along_dim(torch.cat([self.sequences, candidates], dim=1), best[:, :, None], dim=1)
        self.scores = torch.take_along_dim(merged_scores, best, dim=1)
        self.finished = torch.take_along_dim(torch.cat([self.finished, just_ended], dim=1), best, dim=1)
        self.lengths = torch.take_along_dim(
            torch.cat([self.lengths, torch.full_like(ends, t + 1, dtype=torch.long)], 1), best, dim=1
        )

    def _update_improvable(self, generated: int) -> None:
        """Stop a request once its best running beam cannot beat its worst finished one (transformers' heuristic)."""
        length = self.max_new_tokens if self.early_stopping == "never" and self.length_penalty > 0.0 else generated
        best_running = self.running_scores[:, :1] / (length**self.length_penalty)  # [B, 1]
        worst_finished = torch.where(self.finished, self.scores.min(dim=1, keepdim=True).values, PENALTY)  # [B, k]
        self.improvable = self.improvable & (best_running > worst_finished).any(dim=-1, keepdim=True)

    def running_beams(self, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The live beams after token t, for streaming: (ids [B, k, t+1], lengths [B, k])."""
        return self.running[:, :, : t + 1], torch.full(self.running.shape[:2], t + 1, device=self.running.device)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The k finished hypotheses of each request, best first: (ids [B, k, max_new], generated lengths [B, k])."""
        return self.sequences, self.lengths
