"""LSTM / GRU cores that honour episode starts anywhere in a chunk.

A single time step (the rollout's call) goes through the cell kernel, which is several times cheaper on CPU.
Longer sequences are cut at every time step where *some* row starts an episode; each piece runs as one fused
``nn.LSTM``/``nn.GRU`` call, and at the cut the rows that start an episode get a zero state. With no
resets inside a chunk this is a single call, so training stays fast. Chunked and step-by-step execution agree
to float rounding (tested to 1e-5): the trainer's re-evaluation sees what the rollout's policy computed.
"""

from __future__ import annotations

import torch
from torch import nn

from craftrl.policies.state import State


class ResettableRNN(nn.Module):
    """Single-layer LSTM or GRU over ``[B, T, F]`` with a ``{"h": [B, H], ("c": [B, H])}`` state."""

    def __init__(self, input_size: int, hidden_size: int, kind: str = "lstm") -> None:
        super().__init__()
        if kind not in ("lstm", "gru"):
            raise ValueError(f"recurrent kind must be 'lstm' or 'gru', got {kind!r}")
        self.kind = kind
        self.hidden_size = hidden_size
        rnn_class = nn.LSTM if kind == "lstm" else nn.GRU
        self.rnn = rnn_class(input_size, hidden_size, batch_first=True)
        for name, param in self.rnn.named_parameters():
            if "weight" in name:
                nn.init.orthogonal_(param, gain=1.0)
            else:
                nn.init.zeros_(param)

    def initial_state(self, batch_size: int, device: torch.device) -> State:
        zeros = lambda: torch.zeros(batch_size, self.hidden_size, device=device)  # noqa: E731
        return {"h": zeros(), "c": zeros()} if self.kind == "lstm" else {"h": zeros()}

    def forward(self, x: torch.Tensor, state: State, first: torch.Tensor) -> tuple[torch.Tensor, State]:
        time = x.shape[1]
        if time == 1:
            return self._single_step(x, state, first)
        inner_starts = (first[:, 1:].any(dim=0).nonzero().flatten() + 1).tolist()  # one device sync
        cut_points = [0] + inner_starts + [time]
        outputs = []
        for start, end in zip(cut_points[:-1], cut_points[1:]):
            keep = (~first[:, start]).to(x.dtype)[:, None]
            state = {key: value * keep for key, value in state.items()}
            if self.kind == "lstm":
                out, (h, c) = self.rnn(x[:, start:end], (state["h"][None], state["c"][None]))
                state = {"h": h[0], "c": c[0]}
            else:
                out, h = self.rnn(x[:, start:end], state["h"][None])
                state = {"h": h[0]}
            outputs.append(out)
        return torch.cat(outputs, dim=1) if len(outputs) > 1 else outputs[0], state

    def _single_step(self, x: torch.Tensor, state: State, first: torch.Tensor) -> tuple[torch.Tensor, State]:
        """One step through the cell kernel with the same weights: the rollout's per-step call.

        ``nn.LSTM`` on one time step of a small batch costs several times the cell kernel on CPU (its sequence
        machinery dominates); the results agree to float rounding.
        """
        keep = (~first[:, 0]).to(x.dtype)[:, None]
        rnn = self.rnn
        weights = (rnn.weight_ih_l0, rnn.weight_hh_l0, rnn.bias_ih_l0, rnn.bias_hh_l0)
        if self.kind == "lstm":
            h, c = torch.lstm_cell(x[:, 0], (state["h"] * keep, state["c"] * keep), *weights)
            return h[:, None], {"h": h, "c": c}
        h = torch.gru_cell(x[:, 0], state["h"] * keep, *weights)
        return h[:, None], {"h": h}
