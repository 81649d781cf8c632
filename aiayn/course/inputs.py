"""The inputs the checks send to the student's function that are not plain tensors: a stand-in model, an optimizer
and a scheduler that record what they saw. The checks build them in the grader's process; a graded kernel imports this
module (beside ``kernel``) to receive them. None of them holds a reference implementation.

Not about the paper: the exercises live in the chapters (book/) and course/.
"""

import types

import torch

BOS, EOS, PAD = 1, 2, 0


class TableModel(torch.nn.Module):
    """A stand-in with the Transformer's interface: the logits of the next token depend only on the previous one,
    table[previous] = {token: logit}; other tokens get -5, whatever the source."""

    def __init__(self, table: dict, V: int = 10):
        super().__init__()
        self.V = V
        self.config = types.SimpleNamespace(pad_id=PAD, vocab_size=V, max_len=64, N=1, d_model=V)
        self.generator = torch.nn.Identity()
        logits = torch.full((V, V), -5.0)
        for a, row in table.items():
            for b, value in row.items():
                logits[a, b] = value
        self.register_buffer("logits", logits)

    def encode(self, src):
        return torch.zeros(src.size(0), src.size(1), self.V), (src != PAD)[:, None, None, :]

    def decode(self, tgt, memory, src_mask, cache=None, start=0):
        return self.logits[tgt]  # (batch, T, V): the "hidden state" is the logits

    def new_cache(self):
        return [{}]

    def forward(self, src, tgt):
        return self.generator(self.decode(tgt, *self.encode(src)))


class Recording(torch.optim.SGD):
    """SGD that records the learning rate and the gradients it saw at each update."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.seen = ()  # a tuple: code that adds to the record assigns to optimizer.seen, which the flags name

    def step(self, closure=None):
        self.seen += ((self.param_groups[0]["lr"], [p.grad.clone() for p in self.param_groups[0]["params"]]),)
        return super().step(closure)

    def __getstate__(self):  # an optimizer pickles only its own state
        return {**super().__getstate__(), "seen": self.seen}

    def __data__(self):
        return {"seen": self.seen}


class Noam:
    """Equation (3) with d_model 16, warmup 10 and a factor 100, as a LambdaLR factor of step s (from 0)."""

    def __call__(self, s):
        return 100.0 * 16**-0.5 * min((s + 1) ** -0.5, (s + 1) * 10**-1.5)


class Scheduler(torch.optim.lr_scheduler.LambdaLR):
    """A LambdaLR that reports how often it was stepped."""

    def __data__(self):
        return {"last_epoch": self.last_epoch}


class SquaredError:
    """model(batch) -> the mean squared error of a linear layer on a batch (x, y)."""

    def __init__(self, net):
        self.net = net

    def __call__(self, batch):
        return (self.net(batch[0]) - batch[1]).pow(2).mean()

    def __data__(self):
        return {"params": [p.detach() for p in self.net.parameters()]}
