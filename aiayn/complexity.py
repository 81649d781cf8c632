# Generated from book/08_why_self_attention.ipynb by `python -m aiayn._export`. Edit the chapter, not this file.

# book/08_why_self_attention.ipynb: Four layers, one interface
import math
import time
import weakref

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

from aiayn.attention import attention


# book/08_why_self_attention.ipynb: Four layers, one interface
class SelfAttention(nn.Module):
    """Table 1, row 1: Equation (1) with Q = K = V = x; every position
    attends to every position."""

    def forward(self, x):  # (batch, n, d)
        return attention(x, x, x)[0]  # (batch, n, d)


class Recurrent(nn.Module):
    """Table 1, row 2: h_t = tanh(x_t W + h_{t-1} U + b), one step after
    another (§1)."""

    def __init__(self, d: int):
        super().__init__()
        self.W = nn.Linear(d, d)
        self.U = nn.Linear(d, d, bias=False)

    def forward(self, x):  # (batch, n, d)
        xW = self.W(x)  # (batch, n, d): the input's part, all at once
        h = x.new_zeros(x.size(0), x.size(2))  # (batch, d)
        states = []
        for t in range(x.size(1)):  # n sequential steps: t needs h_{t-1}
            h = torch.tanh(xW[:, t] + self.U(h))  # (batch, d)
            states.append(h)
        return torch.stack(states, dim=1)  # (batch, n, d)


# book/08_why_self_attention.ipynb: Four layers, one interface
def _check_odd(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 1 or value % 2 == 0:
        raise ValueError(f"{name} must be a positive odd integer (a window "
                         f"centred on its position), got {value!r}")


class Convolutional(nn.Module):
    """Table 1, row 3: a 1-d convolution of kernel width k (odd, centred),
    d channels in and out, length kept."""

    def __init__(self, d: int, k: int, dilation: int = 1):
        super().__init__()
        _check_odd("k", k)
        self.conv = nn.Conv1d(d, d, k, padding=dilation * (k - 1) // 2,
                              dilation=dilation)

    def forward(self, x):  # (batch, n, d)
        return self.conv(x.transpose(1, 2)).transpose(1, 2)  # (batch, n, d)


class SeparableConvolutional(nn.Module):
    """§4's separable convolution: a depthwise convolution of width k, then
    a point-wise d x d map."""

    def __init__(self, d: int, k: int):
        super().__init__()
        _check_odd("k", k)
        # each channel on its own
        self.depthwise = nn.Conv1d(d, d, k, padding=(k - 1) // 2, groups=d)
        self.pointwise = nn.Conv1d(d, d, 1)

    def forward(self, x):  # (batch, n, d)
        y = self.pointwise(self.depthwise(x.transpose(1, 2)))  # (batch, d, n)
        return y.transpose(1, 2)  # (batch, n, d)


# book/08_why_self_attention.ipynb: Four layers, one interface
class RestrictedSelfAttention(nn.Module):
    """Table 1, row 4: each position attends to the r positions of a window
    centred on it (r odd)."""

    def __init__(self, r: int):
        super().__init__()
        _check_odd("r", r)
        self.r = r

    def forward(self, x):  # (batch, n, d)
        n, w = x.size(1), (self.r - 1) // 2
        padded = F.pad(x, (0, 0, w, w))  # (batch, n + 2w, d)
        windows = padded.unfold(1, self.r, 1).transpose(-2, -1).contiguous()
        # windows: (batch, n, r, d); j: the position of each window's entry
        offsets = torch.arange(-w, w + 1, device=x.device)
        j = torch.arange(n, device=x.device)[:, None] + offsets  # (n, r)
        inside = ((j >= 0) & (j < n))[:, None, :]  # (n, 1, r): not padding
        # one query per window: (batch, n, 1, d)
        z, _ = attention(x[:, :, None, :], windows, windows, inside)
        return z[:, :, 0, :]  # (batch, n, d)


# book/08_why_self_attention.ipynb: Complexity per layer, counted
TABLE_1 = {  # the paper's Table 1: complexity, sequential ops, path length
    "self-attention": ("O(n^2 d)", "O(1)", "O(1)"),
    "recurrent": ("O(n d^2)", "O(n)", "O(n)"),
    "convolutional": ("O(k n d^2)", "O(1)", "O(log_k(n))"),
    "restricted": ("O(r n d)", "O(1)", "O(n/r)"),
}


def count_flops(layer: nn.Module, x: torch.Tensor) -> int:
    """FLOPs of one forward pass as torch.utils.flop_counter counts them
    (matrix products and convolutions)."""
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        layer(x)
    return counter.get_total_flops()


def exact_flops(kind: str, b: int, n: int, d: int, k: int = 3,
                r: int = 5) -> int:
    """The counter's FLOPs for our layers in closed form (§4, Table 1 times
    a constant)."""
    formulas = {"self-attention": 4 * b * n * n * d,
                "recurrent": 4 * b * n * d * d,
                "convolutional": 2 * b * k * n * d * d,
                "separable": 2 * b * k * n * d + 2 * b * n * d * d,
                "restricted": 4 * b * r * n * d}
    if kind not in formulas:
        raise ValueError(f"unknown layer type {kind!r}; "
                         f"choose one of {sorted(formulas)}")
    return formulas[kind]


def make_layers(d: int, k: int = 3, r: int = 5) -> dict[str, nn.Module]:
    """One layer of each type of Table 1 (and the separable convolution of
    §4), all (batch, n, d) -> (batch, n, d)."""
    return {"self-attention": SelfAttention(), "recurrent": Recurrent(d),
            "convolutional": Convolutional(d, k),
            "separable": SeparableConvolutional(d, k),
            "restricted": RestrictedSelfAttention(r)}


# book/08_why_self_attention.ipynb: Sequential operations and time
class OpsAndMemory(TorchDispatchMode):
    """Counts the operations a forward pass dispatches and the peak bytes
    held by the tensors it creates (§4)."""

    def __init__(self):
        super().__init__()
        self.ops, self.current, self.peak = 0, 0, 0
        self._live = {}  # storage -> [bytes, tensors]

    def _release(self, key):
        entry = self._live[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.current -= entry[0]
            del self._live[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        tensors_in = tree_flatten((args, kwargs))[0]
        inputs = {t.untyped_storage().data_ptr() for t in tensors_in
                  if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            key = t.untyped_storage().data_ptr()
            if key not in self._live:
                if key in inputs:  # a view of a tensor made outside the layer
                    continue  # no new memory
                self._live[key] = [t.untyped_storage().nbytes(), 0]
                self.current += self._live[key][0]
                self.peak = max(self.peak, self.current)
            self._live[key][1] += 1
            weakref.finalize(t, self._release, key)
        return out


# book/08_why_self_attention.ipynb: Sequential operations and time
def measure(layer: nn.Module, n: int, d: int, batch: int = 1,
            repeats: int = 3, device="cpu") -> dict:
    """Forward time (best of `repeats`, s), peak extra memory (bytes) and
    dispatched operations of one layer."""
    device = torch.device(device)
    x = torch.randn(batch, n, d, device=device)  # (batch, n, d)
    sync = (torch.cuda.synchronize if device.type == "cuda"
            else (lambda: None))
    with torch.no_grad():
        with OpsAndMemory() as counter:
            layer(x)
        seconds = []
        for _ in range(repeats + 1):  # the first run warms up, not kept
            sync()
            start = time.perf_counter()
            layer(x)
            sync()
            seconds.append(time.perf_counter() - start)
        peak = counter.peak
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            layer(x)
            sync()
            peak = torch.cuda.max_memory_allocated(device) - base
    return {"n": n, "seconds": min(seconds[1:]), "peak_bytes": peak,
            "ops": counter.ops}


def measure_layers(ns, d: int, k: int = 3, r: int = 5, batch: int = 1,
                   repeats: int = 3, device="cpu", seed: int = 0,
                   log=None) -> dict[str, list[dict]]:
    """`measure` for every layer type of `make_layers` and every length in
    `ns`: {layer type: [one dict per n]}."""
    torch.manual_seed(seed)
    results = {}
    for kind, layer in make_layers(d, k, r).items():
        layer = layer.to(device).eval()
        results[kind] = [measure(layer, n, d, batch, repeats, device)
                         for n in ns]
        if log:
            log(f"{kind:15s} " + "  ".join(
                f"n={m['n']}: {m['seconds'] * 1e3:.2f} ms"
                for m in results[kind]))
    return results


# book/08_why_self_attention.ipynb: Maximum path length
def layers_needed(kind: str, j: int, k: int = 3, r: int = 5) -> int:
    """§4, Table 1's last column, exactly: layers a stack needs before
    output 0 depends on input j (at least 1)."""
    if kind == "self-attention":
        return 1
    if kind == "convolutional":
        return max(1, math.ceil(2 * j / (k - 1)))
    if kind == "dilated":
        return max(1, next(L for L in range(64) if (k**L - 1) // 2 >= j))
    if kind == "restricted":
        return max(1, math.ceil(2 * j / (r - 1)))
    raise ValueError(f"unknown layer type {kind!r}; choose self-attention, "
                     "convolutional, dilated or restricted")


def stack(kind: str, L: int, d: int, k: int = 3, r: int = 5):
    """L layers of one type with tanh between them; "dilated" convolutions
    have dilation k**l in layer l."""
    makers = {"self-attention": lambda l: SelfAttention(),
              "recurrent": lambda l: Recurrent(d),
              "convolutional": lambda l: Convolutional(d, k),
              "dilated": lambda l: Convolutional(d, k, k**l),
              "restricted": lambda l: RestrictedSelfAttention(r)}
    if kind not in makers:
        raise ValueError(f"unknown layer type {kind!r}; "
                         f"choose one of {sorted(makers)}")
    return nn.Sequential(*[m for l in range(L)
                           for m in (makers[kind](l), nn.Tanh())])


def gradient_reach(layers: nn.Module, n: int, d: int, i: int = 0,
                   seed: int = 0) -> torch.Tensor:
    """For every input position j, the norm of the d x d block
    d z_i / d x_j: exactly zero where no path joins them."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, n, d, generator=gen)  # (1, n, d)
    J = torch.autograd.functional.jacobian(lambda x: layers(x)[0, i], x)
    return J.square().sum(dim=(0, 1, 3)).sqrt()  # J: (d, 1, n, d) -> (n,)
