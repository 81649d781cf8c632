# Generated from book/04_feed_forward.ipynb by `python -m aiayn._export`. Edit the chapter, not this file.

# book/04_feed_forward.ipynb: The equation
from torch import nn


# book/04_feed_forward.ipynb: The equation
class PositionwiseFeedForward(nn.Module):
    """§3.3, Equation (2): FFN(x) = max(0, x W_1 + b_1) W_2 + b_2.

    Applied to each position alike (position-wise).
    """

    def __init__(self, d_model: int, d_ff: int, P_drop: float = 0.0):
        super().__init__()
        for name, value in (("d_model", d_model), ("d_ff", d_ff)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(
                    f"{name} must be a positive integer, got {value!r}")
        if not 0.0 <= P_drop < 1.0:
            raise ValueError(f"P_drop must lie in [0, 1), got {P_drop!r}")
        self.W_1 = nn.Linear(d_model, d_ff)
        self.W_2 = nn.Linear(d_ff, d_model)
        # on the hidden activations (tensor2tensor's relu_dropout)
        self.dropout = nn.Dropout(P_drop)

    def forward(self, x):  # (batch, len, d_model)
        hidden = self.W_1(x).relu()  # (batch, len, d_ff)
        return self.W_2(self.dropout(hidden))  # (batch, len, d_model)
