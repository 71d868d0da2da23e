"""Engine, CUDA graphs — the decode step captured once per (batch rows, KV length bucket), then replayed each token."""

import torch

KV_BUCKET = 64  # keys attended to are rounded up to a multiple of this: one graph serves 64 consecutive steps
WARMUP_STEPS = 2  # eager runs before a capture: compile, cuBLAS workspaces, allocator


def kv_bucket(kv_len: int, max_seq_len: int) -> int:
    """The KV length a decode step attends to: kv_len rounded up to KV_BUCKET, at most max_seq_len (keys after a
    row's position are masked by the position, so every back end gives the same logits with or without graphs)."""
    return min(max_seq_len, -(-kv_len // KV_BUCKET) * KV_BUCKET)


class DecodeGraphs:
    """Calls `step(ids, pos, kv_len)` as a CUDA-graph replay, through static input buffers.

    The step must read its inputs only from the tensors it is given (positions and masks included) and may
    write the KV cache in place: replaying the graph redoes exactly that. kv_len is a bucket (kv_bucket).
    """

    def __init__(self, step, max_rows: int, device):
        self.step, self.device = step, torch.device(device)
        self.ids = torch.zeros(max_rows, dtype=torch.long, device=self.device)  # [rows] static input
        self.pos = torch.zeros(max_rows, dtype=torch.long, device=self.device)  # [rows] static input
        self.graphs = {}  # (rows, bucket) -> (CUDAGraph, static logits [rows, V])
        self.pool = None  # one memory pool shared by every graph (they never run at once)

    def __call__(self, ids: torch.Tensor, pos: torch.Tensor, kv_len: int) -> torch.Tensor:
        """Logits [n, V] of one decode step, a static buffer: read it before the next call."""
        n = ids.shape[0]
        self.ids[:n].copy_(ids)
        self.pos[:n].copy_(pos)
        if (n, kv_len) not in self.graphs:
            self.graphs[n, kv_len] = self._record(n, kv_len)
        graph, logits = self.graphs[n, kv_len]
        graph.replay()
        return logits

    def _record(self, n: int, bucket: int):
        """Warm up on a side stream, then capture the step; the warm-up rewrites the same cache entries."""
        ids, pos = self.ids[:n], self.pos[:n]
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                self.step(ids, pos, bucket)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self.step(ids, pos, bucket)
        self.pool = graph.pool()
        return graph, logits

    def __len__(self) -> int:
        return len(self.graphs)
