"""DeepSpeech2 (Amodei et al. 2016) as the Pollux traces ran it (deepspeech.pytorch's layout):
two 2-D convolutions over the spectrogram, five bidirectional GRU layers whose two directions
are summed, and a per-frame character classifier trained with CTC. For tracing only."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class DeepSpeech2(nn.Module):
    def __init__(
        self, freq: int = 161, hidden: int = 768, layers: int = 5, chars: int = 29
    ) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(1, 32, (41, 11), (2, 2), (20, 5)),
            nn.BatchNorm2d(32),
            nn.Hardtanh(0, 20, inplace=True),
            nn.Conv2d(32, 32, (21, 11), (2, 1), (10, 5)),
            nn.BatchNorm2d(32),
            nn.Hardtanh(0, 20, inplace=True),
        )
        rows = ((freq + 40 - 41) // 2 + 1 + 20 - 21) // 2 + 1
        self.rnns = nn.ModuleList(
            nn.GRU(32 * rows if i == 0 else hidden, hidden, bidirectional=True, batch_first=True)
            for i in range(layers)
        )
        self.norms = nn.ModuleList(nn.BatchNorm1d(hidden) for _ in range(layers - 1))
        self.fc = nn.Sequential(nn.BatchNorm1d(hidden), nn.Linear(hidden, chars, bias=False))
        self.hidden = hidden

    def forward(self, spectrogram: torch.Tensor) -> torch.Tensor:
        x = self.conv(spectrogram)  # (B, 32, rows, T/2)
        b, c, rows, t = x.shape
        x = x.view(b, c * rows, t).transpose(1, 2)  # (B, T/2, features)
        for i, rnn in enumerate(self.rnns):
            if i > 0:
                x = self.norms[i - 1](x.transpose(1, 2)).transpose(1, 2)
            x, _ = rnn(x)
            x = x.view(b, t, 2, self.hidden).sum(2)
        x = self.fc[0](x.transpose(1, 2)).transpose(1, 2)
        return F.log_softmax(self.fc[1](x), -1)
