from torch import nn


class PositionwiseFeedForward(nn.Module):
    """§3.3, Equation (2): FFN(x) = max(0, x W_1 + b_1) W_2 + b_2, applied to each position alike."""

    def __init__(self, d_model: int, d_ff: int, P_drop: float = 0.0):
        super().__init__()
        self.W_1 = nn.Linear(d_model, d_ff)
        self.W_2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(P_drop)

    def forward(self, x):  # (batch, len, d_model)
        return self.W_2(self.dropout(self.W_1(x).relu()))
