"""The checks of the autograded exercises. Each check is one graded cell of an assignment notebook, worth its points.

A check calls the student's function through ``call(f, *args)``, which returns the result as data (tensors, numbers,
strings, lists, tuples, dicts), then compares it with its own reference implementation and known values: it fails
with a ``Failed`` whose message is the feedback (what is wrong, by how much, and, where a common mistake explains it,
why). Under the course's grader (``aiayn/course/grader.py``) every check runs in the grader's own process, and each
call travels to the submission's sandboxed kernel and back as data (``aiayn/course/kernel.py``): neither this file
nor its references enter the sandbox. In a student's own run (a clone of the book), a check cell reads

    from aiayn.course.checks import check
    check("label_smoothing", "no_pad", globals())

and calls the student's function in the same process, through the same conversion to data, so the points agree.

Not about the paper: the exercises and their text live in the chapters (book/) and course/.
"""

import contextlib
import io
import math
import os
import random
import secrets
import textwrap
import types
import warnings
from dataclasses import dataclass, field
from typing import Callable

from aiayn.course import inputs, kernel

CALL_SECONDS = float(os.environ.get("AIAYN_CHECK_SECONDS", 10))  # each call of the student's function, at most
# The checks' random inputs are drawn afresh by each process that grades (each `nbgrader autograde`, each student's
# own run), so that no submission can recognise them and answer from a table; the known values stay fixed.
# AIAYN_CHECK_SEED fixes them, to reproduce a grading (a graded kernel never sees the grader's environment).
SEED = int(os.environ.get("AIAYN_CHECK_SEED") or secrets.randbelow(1 << 30))


class Failed(AssertionError):
    """A check that does not pass; the message is the feedback."""


@dataclass
class Check:
    key: str
    what: str
    points: int
    run: Callable  # run(f, call): raises Failed when the check does not pass


@dataclass
class Assignment:
    """An exercise graded by checks: the function the student writes, what it may not call, and the checks."""

    key: str
    title: str
    notebook: str  # the notebook's name without its number: "attention" for book/02_attention.ipynb
    names: list[str]  # the student's function or class, under any of these names
    signature: str
    references: list[str] = field(default_factory=list)  # dotted paths of what the student's code may not call
    minutes: int = 0  # suggested time, for the larger assignments
    checks: list[Check] = field(default_factory=list)
    # the book's classes among the references that the exercise hands to the student's function or asks it to build:
    # named in the student's cells, they are not flagged as the book's code (calling them still is)
    given: list[str] = field(default_factory=list)

    @property
    def points(self) -> int:
        return sum(c.points for c in self.checks)


ASSIGNMENTS: dict[str, Assignment] = {}


def _assignment(key, title, notebook, names, signature, references=(), minutes=0, given=()):
    def register(make_checks):
        checks = [Check(*c) for c in make_checks()]
        ASSIGNMENTS[key] = Assignment(
            key, title, notebook, list(names), signature, list(references), minutes, checks, list(given)
        )
        return make_checks

    return register


# ----------------------------------------------------------------------------------------------------------
# Running a check
# ----------------------------------------------------------------------------------------------------------


class Call:
    """``call(f, *args, **kwargs)``: one call of the student's function (``f`` names it), answered as data by
    ``answer(request)``: in the same process (``local``) or by the submission's kernel (the grader).

    ``_init``: a student's class is made with these arguments, then called with ``args``; a function takes them
    after ``args``, or, with ``_made``, makes with them what is then called with ``args`` (a module it builds).
    ``_grad=i``: the result is (value, its gradient with respect to ``args[i]``). ``_observe``: the result is (value,
    the inputs as they are after the call)."""

    def __init__(self, a: "Assignment", answer: Callable[[dict], dict]):
        self.a, self.answer, self.calls, self.threads, self.changed, self.chapter = a, answer, [], 0, False, set()

    def __call__(self, f, *args, _init=None, _made=False, _grad=None, _observe=False, **kwargs):
        request = {"names": self.a.names, "args": list(args), "kwargs": kwargs, "init": _init, "grad": _grad}
        request["made"] = _made
        request |= {"observe": _observe, "references": self.a.references, "seconds": CALL_SECONDS}
        answer = self.answer(request)
        self.threads, self.chapter = max(self.threads, answer.get("threads", 0)), self.chapter | {*answer["chapter"]}
        self.changed |= (answer["error"] or ("",))[0] == "AnswerChanged"  # (the grader's: see grader.read_answer)
        if answer["calls"]:
            self.calls.append(answer["calls"][0])
            if answer["calls"][0] == kernel.WATCH_OFF:
                raise Failed(f"your code {kernel.WATCH_OFF}: the checks cannot see what it calls")
            raise Failed(f"your code calls {answer['calls'][0]}, which this exercise asks you to write yourself")
        if answer["missing"]:
            raise Failed(f"no {' or '.join(self.a.names)} is defined: the checks call {self.a.signature}")
        if answer["timeout"]:
            raise Failed(f"your function did not return within {CALL_SECONDS:g} s (an endless loop?)")
        if answer["error"]:
            name, message = answer["error"]
            if name == "NotImplementedError":
                raise Failed("not implemented yet: write your code in place of `raise NotImplementedError()`")
            unread = name in ("TooLarge", "NoResult", "AnswerChanged")
            said = "its result was not read" if unread else f"your code raised {name}"
            raise Failed(f"{said}: {message}"[:400])
        return answer["value"]


def local(namespace: dict) -> Callable[[dict], dict]:
    """Answers in this process, from the functions in ``namespace``; the inputs and the result go through the same
    serialisation as the grader's, so the student's code sees the same objects."""

    def answer(request: dict) -> dict:
        import torch

        buffer = io.BytesIO()
        torch.save(request, buffer)
        buffer.seek(0)
        return kernel.run(torch.load(buffer, weights_only=False), namespace)

    return answer


def verdict(assignment: str, key: str, answer: Callable[[dict], dict]) -> tuple[Check, str, list[str]]:
    """(the check, "" when it passes or why not, flags for the report): check ``key`` of ``assignment``."""
    a = ASSIGNMENTS[assignment]
    c = next((c for c in a.checks if c.key == key), None)
    if c is None:
        raise KeyError(f"{assignment} has no check {key!r}; its checks are {[c.key for c in a.checks]}")
    call = Call(a, answer)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            c.run(types.SimpleNamespace(names=a.names), call)
        message = ""
    except Failed as err:
        message = str(err)
    except Exception as err:  # the student's result, read by the check, raising
        if getattr(err, "stops_grading", False):  # the grader's: the kernel is stuck or gone
            raise
        lines = str(err).strip().splitlines()
        message = f"your function's result could not be checked: {type(err).__name__}: {lines[0] if lines else ''}"
    flags = [name if name == kernel.WATCH_OFF else f"calls {name}" for name in call.calls[:1]]
    if call.threads:  # a thread started before the call, which the call watch does not see: what does it run?
        flags.append(f"ran {call.threads} thread(s) of its own while the checks called its function")
    flags += ["an answer not the one its call wrote (changed after the call)"] * call.changed
    # a function of the chapter's cells that the exercise does not hand over: what of the answer did it compute?
    flags += [f"calls {', '.join(sorted(call.chapter))} (not one the exercise hands over)"] * bool(call.chapter)
    return c, message[:600], flags


def feedback(c: Check, message: str) -> str:
    """What a check cell prints: its points and, when it fails, why."""
    points = f"{c.points} point{'s' * (c.points != 1)}"
    if not message:
        return f"passed, {points}: {c.what}"
    return f"failed, 0 of {points}: {c.what}\n" + textwrap.fill(
        message, 100, initial_indent="  ", subsequent_indent="  "
    )


def check(assignment: str, key: str, namespace: dict) -> None:
    """A check cell in the student's own run: the student's function found by name in ``namespace`` (a notebook's
    ``globals()``); prints the points, and raises ``Failed`` (0 points) when the check does not pass."""
    c, message, _ = verdict(assignment, key, local(namespace))
    print(feedback(c, message))
    if message:
        raise Failed(message) from None


def results(assignment: str, namespace) -> list[tuple[Check, str]]:
    """Every check of ``assignment`` on a namespace (or on the function itself): [(check, "" or the failure)]."""
    a = ASSIGNMENTS[assignment]
    namespace = namespace if isinstance(namespace, dict) else {a.names[0]: namespace}
    return [verdict(assignment, c.key, local(namespace))[:2] for c in a.checks]


# ----------------------------------------------------------------------------------------------------------
# Comparing numbers, with relative errors
# ----------------------------------------------------------------------------------------------------------


def _torch():
    import torch

    return torch


def _tensor(x):
    torch = _torch()
    if isinstance(x, (tuple, list)) and x and isinstance(x[0], torch.Tensor) and len(x) == 2:
        x = x[0]  # (output, weights)
    if isinstance(x, torch.Tensor) and type(x) not in (torch.Tensor, torch.nn.Parameter):
        raise Failed(f"return a torch.Tensor, not a {type(x).__name__}: a subclass can change how it compares")
    return torch.as_tensor(x.detach() if isinstance(x, torch.Tensor) else x).to(torch.float64).cpu()


def _percent(x: float) -> str:
    return f"{x:.1%}" if x >= 1e-3 else f"{x:.1e}"


def _relative(got: float, want: float) -> str:
    if want == 0:
        return f"got {got:.6g}, expected 0"
    return f"got {got:.6g}, expected {want:.6g}: off by {_percent(abs(got - want) / abs(want))} (relative)"


def _close(got, want, what: str, rtol: float = 1e-5, atol: float = 1e-7, hints=()) -> None:
    """Fail unless ``got`` equals ``want`` elementwise to ``rtol`` (and, for entries near 0, to ``rtol`` of the largest
    expected entry: rounding in float32 is relative to the tensor's scale, and the inputs are random); the message
    names the worst entry and its relative error. ``hints`` are (wrong result, cause) pairs: when ``got`` equals a
    known wrong result, the cause is named."""
    torch = _torch()
    got, want = _tensor(got), _tensor(want)
    if got.shape != want.shape:
        raise Failed(f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    if want.numel() and torch.isfinite(want).all():
        atol = max(atol, rtol * want.abs().max().item())
    if torch.allclose(got, want, rtol=rtol, atol=atol):
        return
    for wrong, cause in hints:
        wrong = _tensor(wrong)
        if wrong.shape == got.shape and torch.allclose(got, wrong, rtol=rtol, atol=atol, equal_nan=True):
            raise Failed(f"{what}: {cause}")
    if not torch.isfinite(got).all():
        raise Failed(f"{what}: the result has NaN or infinite entries where finite values are expected")
    if got.numel() == 1:
        raise Failed(f"{what}: {_relative(got.item(), want.item())}")
    err = (got - want).abs()
    i = int(err.flatten().argmax())
    where = tuple(int(j) for j in torch.unravel_index(torch.tensor(i), got.shape))
    scale = want.abs().max().item() or 1.0
    raise Failed(
        f"{what}: off by up to {_percent(err.max().item() / scale)} of the largest expected entry "
        f"({scale:.3g}); at index {where} got {got.flatten()[i].item():.6g}, expected "
        f"{want.flatten()[i].item():.6g}"
    )


def _equal(got, want, what: str) -> None:
    if got != want:
        raise Failed(f"{what}: got {got!r}, expected {want!r}")


def _whole(got, want: int, what: str, causes=()) -> None:
    """Fail unless ``got`` (a number, or a tensor of one) is the whole number ``want``, as a count by hand must be;
    ``causes`` are (wrong number, cause) pairs: when ``got`` is one of them, the cause is named."""
    value = _tensor(got)
    if value.numel() != 1:
        raise Failed(f"{what}: return one number, not a tensor of shape {tuple(value.shape)}")
    value = value.item()
    if value != want:
        cause = next((f": {why}" for wrong, why in causes if value == wrong != want), "")
        shown = f"{int(value):,}" if value.is_integer() else f"{value:g}"
        raise Failed(f"{what}: got {shown}, expected {want:,}{cause}")


def _rng(name: str, k=0) -> random.Random:
    """A check's random inputs, drawn afresh by each grading (``SEED``): no table of answers covers them."""
    return random.Random(f"{name} {SEED} {k}")


# ----------------------------------------------------------------------------------------------------------
# §2 background: the decoder's input under teacher forcing
# ----------------------------------------------------------------------------------------------------------


@_assignment(
    "shift_right",
    "The decoder's input under teacher forcing (§2)",
    "background",
    ["shift_right"],
    "shift_right(y, bos_id) -> (batch, m): bos_id, then y (batch, m) without its last column",
    ["aiayn.batching.collate"],
)
def _shift_right_checks():
    torch = _torch()

    def agrees(f, call):
        for k in range(3):
            rng = _rng("shift_right", k)
            batch, m, bos = rng.randint(1, 4), rng.randint(1, 8), rng.randint(1, 9)
            y = torch.tensor([[rng.randint(10, 99) for _ in range(m)] for _ in range(batch)])
            start = torch.full((batch, 1), bos)
            got, want = call(f, y.clone(), bos), torch.cat([start, y[:, :-1]], 1)
            what = f"shift_right(y, bos_id={bos}) for y of shape {tuple(y.shape)}"
            if not isinstance(got, torch.Tensor):
                raise Failed(f"{what}: return a tensor of the shape of y, not a {type(got).__name__}")
            if got.shape != y.shape:
                longer = got.shape[1:] == (m + 1,)
                cause = ": drop y's last column, so that the decoder input is as long as y" if longer else ""
                raise Failed(f"{what}: shape {tuple(got.shape)}, expected {tuple(y.shape)}{cause}")
            causes = [
                (torch.cat([y[:, 1:], start], 1), "y moved left, with bos_id at the end: y moves right, bos_id first"),
                (torch.cat([y[:, :-1], start], 1), "bos_id goes first, before y's tokens"),
                (y, "y is unchanged"),
            ]
            if got.tolist() != want.tolist():  # the values, whatever the dtype, as the chapter's test compares them
                cause = next((f": {why}" for wrong, why in causes if got.tolist() == wrong.tolist()), "")
                raise Failed(f"{what}: got {got.tolist()}, expected {want.tolist()}{cause}")

    return [("agrees", "bos_id, then y without its last column, for batches drawn at random", 1, agrees)]


# ----------------------------------------------------------------------------------------------------------
# §3.2.1 scaled dot-product attention, with its masks built from lengths and a causal flag
# ----------------------------------------------------------------------------------------------------------

ATTENTION_REFERENCES = [
    "aiayn.attention.attention",
    "aiayn.attention.attend",
    "aiayn.browser._attend",  # the exported graphs' copy of Equation (1)
    "torch.nn.functional.scaled_dot_product_attention",
    "aiayn.multi_head.MultiHeadAttention.forward",
    "torch.nn.MultiheadAttention.forward",
    "torch.nn.functional.multi_head_attention_forward",
    "torch._native_multi_head_attention",  # the fused kernel under PyTorch's multi-head attention
]


def _attention(q, k, v, key_lengths=None, causal=False):
    """Reference: softmax(q k^T / sqrt(d_k)) v, key j of sentence b allowed when j < key_lengths[b] (and j <= i)."""
    torch = _torch()
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (batch, h, len_q, len_k)
    len_q, len_k = scores.shape[-2:]
    allowed = torch.ones(len_q, len_k, dtype=torch.bool)
    if causal:
        allowed = allowed & (torch.arange(len_k)[None, :] <= torch.arange(len_q)[:, None])
    if key_lengths is not None:
        allowed = allowed & (torch.arange(len_k) < torch.as_tensor(key_lengths).view(-1, 1, 1, 1))
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v


@_assignment(
    "attention",
    "Scaled dot-product attention with its masks (§3.2.1)",
    "attention",
    ["my_attention"],
    "my_attention(query, key, value, key_lengths=None, causal=False) -> (batch, h, len_q, d_v): key j of "
    "sentence b may be attended to when j < key_lengths[b], and, with causal=True, when j <= the query's "
    "position",
    ATTENTION_REFERENCES,
    30,
)
def _attention_checks():
    torch = _torch()

    def data(seed, len_q=5, len_k=7):
        g = torch.Generator().manual_seed(SEED + seed)
        return (
            torch.randn(2, 3, len_q, 8, generator=g),
            torch.randn(2, 3, len_k, 8, generator=g),
            torch.randn(2, 3, len_k, 4, generator=g),
        )

    def att(call, f, q, k, v, **kw):
        return _tensor(call(f, q.clone(), k.clone(), v.clone(), **kw))

    def shape(f, call):
        q, k, v = data(0)
        _equal(tuple(att(call, f, q, k, v).shape), (2, 3, 5, 4), "output shape (batch, h, len_q, d_v)")

    def scale(f, call):
        q = torch.ones(1, 1, 1, 4)  # d_k = 4: q.k_1 = 4, q.k_2 = 0
        k = torch.tensor([[[[1.0, 1, 1, 1], [0, 0, 0, 0]]]])
        v = torch.tensor([[[[1.0], [0.0]]]])
        got = att(call, f, q, k, v).flatten()[0].item()
        want = math.exp(2) / (math.exp(2) + 1)  # softmax(4 / sqrt(4), 0)[0] = 0.8808
        causes = {
            round(math.exp(4) / (math.exp(4) + 1), 4): "the scores are not divided by sqrt(d_k)",
            round(math.exp(1) / (math.exp(1) + 1), 4): "the scores are divided by d_k instead of sqrt(d_k)",
        }
        if not abs(got - want) <= 1e-5:  # (NaN too)
            raise Failed(f"{_relative(got, want)}" + (f": {causes[round(got, 4)]}" if round(got, 4) in causes else ""))

    def no_mask(f, call):
        q, k, v = data(1)
        _close(att(call, f, q, k, v), _attention(q, k, v), "without masks")

    def lengths(f, call):
        q, k, v = data(2)
        n = torch.tensor([7, 4])
        out = att(call, f, q, k, v, key_lengths=n)
        _close(
            out,
            _attention(q, k, v, n),
            "with key_lengths [7, 4]",
            hints=[
                (_attention(q, k, v), "key_lengths is ignored"),
                (_attention(q, k, v, torch.tensor([6, 3])), "one key too few: keys j < key_lengths are real"),
            ],
        )
        k2, v2 = k.clone(), v.clone()
        k2[1, :, 4:] += 5.0
        v2[1, :, 4:] += 5.0
        _close(
            att(call, f, q, k2, v2, key_lengths=n),
            out,
            "changing the keys and values after key_lengths changed the output",
        )

    def one_key(f, call):
        q, k, v = data(3)
        got = att(call, f, q, k, v, key_lengths=torch.tensor([1, 2]))
        _close(got[0], v[0, :, :1].expand(3, 5, 4), "with key_lengths 1 every query must return the first value")

    def causal(f, call):
        q, k, v = data(4, 5, 5)
        out = att(call, f, q, k, v, causal=True)
        _close(out, _attention(q, k, v, causal=True), "causal=True", hints=[(_attention(q, k, v), "causal is ignored")])
        v2 = v.clone()
        v2[..., 3:, :] += 10.0  # the future of positions 0, 1, 2
        _close(att(call, f, q, k, v2, causal=True)[..., :3, :], out[..., :3, :], "a position saw values after it")

    def both(f, call):
        q, k, v = data(5, 6, 6)
        n = torch.tensor([6, 3])
        _close(
            att(call, f, q, k, v, key_lengths=n, causal=True),
            _attention(q, k, v, n, causal=True),
            "key_lengths [6, 3] and causal=True together",
            hints=[
                (_attention(q, k, v, n), "causal is ignored when key_lengths is given"),
                (_attention(q, k, v, causal=True), "key_lengths is ignored when causal is set"),
            ],
        )

    return [
        ("shape", "output shape (batch, h, len_q, d_v)", 1, shape),
        ("scale", "scores divided by sqrt(d_k) (known value 0.8808)", 3, scale),
        ("no_mask", "equals attention without masks", 2, no_mask),
        ("lengths", "key_lengths: keys after a sentence's length have no influence", 2, lengths),
        ("one_key", "key_lengths 1: every query returns the first value", 1, one_key),
        ("causal", "causal=True: no position sees the future", 2, causal),
        ("both", "key_lengths and causal together", 2, both),
    ]


@_assignment(
    "subsequent_mask",
    "A causal mask without tril (§3.2.3)",
    "attention",
    ["my_subsequent_mask"],
    "my_subsequent_mask(size) -> bool (size, size), True where position i may attend to j (j <= i)",
    # a tensor's tril and tril_ run the same operator; and the triangle's indices, numpy's triangles
    ["aiayn.attention.subsequent_mask", "torch.tril", "torch.triu", "torch.tril_indices", "torch.triu_indices"]
    + ["numpy.tril", "numpy.triu", "numpy.tri", "numpy.tril_indices", "numpy.triu_indices"],
)
def _subsequent_mask_checks():
    torch = _torch()

    def agrees(f, call):
        for n in (1, 2, 7):
            got = call(f, n)
            want = torch.arange(n)[None, :] <= torch.arange(n)[:, None]
            if not isinstance(got, torch.Tensor) or got.dtype != torch.bool or got.shape != want.shape:
                raise Failed(
                    f"size {n}: expected a bool tensor of shape {tuple(want.shape)}, got "
                    f"{getattr(got, 'dtype', type(got).__name__)} {tuple(getattr(got, 'shape', ()))}"
                )
            if not torch.equal(got, want):
                cause = " (that is the transposed mask: row i is the query)" if torch.equal(got, want.T) else ""
                raise Failed(f"size {n}: {int((got != want).sum())} entries differ from the causal mask{cause}")

    return [("agrees", "equals the causal mask for sizes 1, 2 and 7", 1, agrees)]


# ----------------------------------------------------------------------------------------------------------
# §3.2.2 multi-head attention, one head at a time
# ----------------------------------------------------------------------------------------------------------


def _multi_head(layer, x, mask=None):
    """Reference from the layer's weights: project, split into heads, attend, concatenate, W^O."""
    B, L, _ = x.shape
    h, d_k = layer.h, layer.d_k
    q, k, v = ((x @ W.weight.T + W.bias).view(B, L, h, d_k).transpose(1, 2) for W in (layer.W_Q, layer.W_K, layer.W_V))
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    heads = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, L, h * d_k)
    return (heads @ layer.W_O.weight.T + layer.W_O.bias).detach()


@_assignment(
    "multi_head",
    "Multi-head attention, one head at a time (§3.2.2)",
    "multi_head",
    ["heads_in_a_loop"],
    "heads_in_a_loop(layer: MultiHeadAttention, x, mask=None) -> (batch, len, d_model), self-attention of x",
    [
        "aiayn.multi_head.MultiHeadAttention.forward",
        "aiayn.browser._attend",  # the exported graphs' copy of a layer's attention
        "torch.nn.MultiheadAttention.forward",
        "torch.nn.functional.multi_head_attention_forward",
        "torch._native_multi_head_attention",
    ],
    45,
    given=["MultiHeadAttention"],
)
def _multi_head_checks():
    torch = _torch()

    def layer_and_x(d_model=24, h=3, d_k=None, seed=0, length=6):
        from aiayn.multi_head import MultiHeadAttention

        torch.manual_seed(SEED + seed)
        return MultiHeadAttention(d_model, h, d_k).eval(), torch.randn(2, length, d_model)

    def run(call, f, layer, x, mask=None):
        with torch.no_grad():
            return _tensor(call(f, layer, x.clone(), mask) if mask is not None else call(f, layer, x.clone()))

    def shape(f, call):
        layer, x = layer_and_x()
        out = run(call, f, layer, x)
        _equal(tuple(out.shape), (2, 6, 24), "output shape (batch, len, d_model)")
        with torch.no_grad():
            layer.W_O.weight.mul_(2)
        if torch.equal(run(call, f, layer, x), out):  # (x itself has the shape too)
            raise Failed("the output does not change with the layer's W_O: it is not the layer's output")

    def known(f, call):
        layer, _ = layer_and_x(4, 1)
        with torch.no_grad():
            for W in (layer.W_Q, layer.W_K, layer.W_V, layer.W_O):
                W.weight.copy_(torch.eye(4))
                W.bias.zero_()
        x = torch.tensor([[[1.0, 0, 0, 0], [0, 1.0, 0, 0]]])
        a = math.exp(0.5) / (math.exp(0.5) + 1)  # softmax(x x^T / sqrt(4)) = softmax(0.5, 0)
        _close(
            run(call, f, layer, x),
            torch.tensor([[[a, 1 - a, 0, 0], [1 - a, a, 0, 0]]]),
            "one head with identity projections is plain attention",
        )

    def plain(f, call):
        layer, x = layer_and_x(seed=1)
        _close(run(call, f, layer, x), _multi_head(layer, x), "without a mask")

    def causal(f, call):
        layer, x = layer_and_x(seed=2)
        m = torch.ones(6, 6, dtype=torch.bool).tril()
        _close(
            run(call, f, layer, x, m),
            _multi_head(layer, x, m),
            "with a causal mask",
            hints=[(_multi_head(layer, x), "the mask is ignored")],
        )

    def any_mask(f, call):
        layer, x = layer_and_x(seed=3)
        m = (torch.rand(6, 6, generator=torch.Generator().manual_seed(SEED + 3)) > 0.5) | torch.eye(6, dtype=torch.bool)
        _close(run(call, f, layer, x, m), _multi_head(layer, x, m), "with a (len, len) mask")

    def other_shapes(f, call):
        layer, x = layer_and_x(16, 4, d_k=8, seed=4, length=5)  # h * d_k = 32 != d_model
        _close(run(call, f, layer, x), _multi_head(layer, x), "d_model=16, h=4, d_k=8")
        layer, x = layer_and_x(12, 6, seed=5, length=3)
        _close(run(call, f, layer, x), _multi_head(layer, x), "d_model=12, h=6")

    return [
        ("shape", "output shape (batch, len, d_model), made by W_O", 1, shape),
        ("known", "one head, identity projections: known values", 2, known),
        ("plain", "equals the layer without a mask", 3, plain),
        ("causal", "equals the layer with a causal mask", 2, causal),
        ("any_mask", "equals the layer with any (len, len) mask", 2, any_mask),
        ("other_shapes", "any h and d_k (h * d_k != d_model too)", 2, other_shapes),
    ]


def _projections(d_model, h, d_k, biases=True, W_O=True) -> int:
    """The parameters of W_Q, W_K, W_V (d_model -> h d_k) and W_O (h d_k -> d_model) with their biases, a multi-head
    layer's; without the biases or without W_O, the counts of two common mistakes."""
    return (3 + W_O) * d_model * h * d_k + (3 * h * d_k + d_model * W_O) * biases


def _sizes(rng, d_model=(8, 1024), h=(1, 16), d_k=(1, 128)) -> tuple[int, int, int]:
    """d_model, h and d_k drawn with h * d_k != d_model, so that a count that takes one for the other fails."""
    while True:
        sizes = rng.randint(*d_model), rng.randint(*h), rng.randint(*d_k)
        if sizes[1] * sizes[2] != sizes[0]:
            return sizes


@_assignment(
    "mha_parameters",
    "The parameters of multi-head attention, by hand (§3.2.2)",
    "multi_head",
    ["mha_parameters"],
    "mha_parameters(d_model, h, d_k) -> int, the parameters of MultiHeadAttention(d_model, h, d_k), as a formula",
    ["aiayn.multi_head.MultiHeadAttention", "aiayn.model.count_parameters", "torch.nn.MultiheadAttention"],
)
def _mha_parameters_checks():
    def agrees(f, call):
        from aiayn.model import count_parameters
        from aiayn.multi_head import MultiHeadAttention

        rng = _rng("mha_parameters")
        for d_model, h, d_k in [(512, 8, 64)] + [_sizes(rng) for _ in range(3)]:
            hk = h * d_k
            _whole(
                call(f, d_model, h, d_k),
                count_parameters(MultiHeadAttention(d_model, h, d_k)),
                f"mha_parameters({d_model}, {h}, {d_k})",
                [
                    (_projections(d_model, h, d_k, biases=False), "the biases are missing"),
                    (_projections(d_model, h, d_k) - d_model, "W_O's bias (d_model entries) is missing"),
                    (
                        4 * d_model * hk + 4 * d_model,
                        "the biases of W_Q, W_K and W_V have h * d_k entries, not d_model",
                    ),
                    (_projections(d_model, h, d_k, W_O=False), "W_O (h * d_k by d_model, and its bias) is missing"),
                    (
                        _projections(d_model, 1, d_model),
                        f"that counts h * d_k as d_model; here h * d_k = {hk}, d_model = {d_model}",
                    ),
                ],
            )

    return [("agrees", "the parameters of MultiHeadAttention, for the base sizes and three drawn at random", 1, agrees)]


# ----------------------------------------------------------------------------------------------------------
# §3.3 the FFN from its weights
# ----------------------------------------------------------------------------------------------------------


@_assignment(
    "ffn_einsum",
    "The FFN with einsum (§3.3)",
    "feed_forward",
    ["ffn_einsum"],
    "ffn_einsum(ffn: PositionwiseFeedForward, x) -> (batch, len, d_model), without calling ffn or its layers",
    ["aiayn.feed_forward.PositionwiseFeedForward.forward", "torch.nn.Linear.forward", "torch.nn.functional.linear"],
    given=["PositionwiseFeedForward"],
)
def _ffn_checks():
    torch = _torch()

    def agrees(f, call):
        from aiayn.feed_forward import PositionwiseFeedForward

        torch.manual_seed(SEED)
        ffn = PositionwiseFeedForward(8, 32).eval()
        x = torch.randn(3, 5, 8)
        with torch.no_grad():
            want = (x @ ffn.W_1.weight.T + ffn.W_1.bias).relu() @ ffn.W_2.weight.T + ffn.W_2.bias
            _close(
                call(f, ffn, x.clone()),
                want,
                "FFN(x) for d_model 8, d_ff 32",
                hints=[
                    (
                        x @ ffn.W_1.weight.T @ ffn.W_2.weight.T + ffn.W_1.bias @ ffn.W_2.weight.T + ffn.W_2.bias,
                        "the ReLU is missing",
                    )
                ],
            )

    return [("agrees", "equals Equation (2) computed from the weights", 1, agrees)]


@_assignment(
    "ffn_from_convs",
    "From convolutions back to an FFN (§3.3)",
    "feed_forward",
    ["ffn_from_convs"],
    "ffn_from_convs(conv_1, conv_2) -> a PositionwiseFeedForward computing conv_2(relu(conv_1(x))), for two "
    "nn.Conv1d of kernel size 1",
    # the module built, not the convolutions run (by any route: every convolution of PyTorch's runs its operator)
    ["torch.nn.Conv1d.forward", "torch.nn.functional.conv1d", "torch.convolution"],
)
def _ffn_from_convs_checks():
    torch = _torch()

    def agrees(f, call):
        for k in range(2):
            rng = _rng("ffn_from_convs", k)
            d_model, d_ff = rng.randint(2, 16), rng.randint(17, 48)
            torch.manual_seed(SEED + k)
            conv_1, conv_2 = torch.nn.Conv1d(d_model, d_ff, 1), torch.nn.Conv1d(d_ff, d_model, 1)
            x = torch.randn(2, 5, d_model)
            with torch.no_grad():
                want = conv_2(conv_1(x.transpose(1, 2)).relu()).transpose(1, 2)
                unrectified = conv_2(conv_1(x.transpose(1, 2))).transpose(1, 2)
            got = call(f, x.clone(), _init=(conv_1, conv_2), _made=True)  # what it returns, called with x
            _close(got, want, f"d_model {d_model}, d_ff {d_ff}", hints=[(unrectified, "the ReLU is missing")])

    return [("agrees", "computes what the two convolutions compute, for sizes drawn at random", 1, agrees)]


# ----------------------------------------------------------------------------------------------------------
# §3.4 embeddings: the scaled lookup, and what tying saves
# ----------------------------------------------------------------------------------------------------------


@_assignment(
    "embed",
    "A scaled embedding from a plain table (§3.4)",
    "embeddings",
    ["my_embed"],
    "my_embed(table: nn.Embedding, tokens) -> (..., d_model), each token's row of the table times sqrt(d_model)",
    ["aiayn.embeddings.Embeddings"],
)
def _embed_checks():
    torch = _torch()

    def agrees(f, call):
        for k in range(2):
            rng = _rng("embed", k)
            V, d_model = rng.randint(5, 60), rng.randint(3, 48)
            torch.manual_seed(SEED + k)
            table, tokens = torch.nn.Embedding(V, d_model), torch.randint(0, V, (rng.randint(1, 4), rng.randint(3, 9)))
            rows = table.weight.detach()[tokens]
            _close(
                call(f, table, tokens.clone()),
                rows * math.sqrt(d_model),
                f"V {V}, d_model {d_model}",
                hints=[
                    (rows, "the rows are not multiplied by sqrt(d_model)"),
                    (rows * d_model, "the rows are multiplied by d_model, not by its square root"),
                    (rows / math.sqrt(d_model), "the rows are divided by sqrt(d_model); they are multiplied by it"),
                ],
            )

    return [("agrees", "each token's row times sqrt(d_model), for tables drawn at random", 1, agrees)]


@_assignment(
    "tying_saves",
    "What three-way tying saves (§3.4)",
    "embeddings",
    ["tying_saves"],
    "tying_saves(V, d_model) -> int, the parameters saved by one shared (V, d_model) table instead of three",
    [
        "aiayn.model.parameter_count",
        "aiayn.model.count_parameters",
        "aiayn.model.make_model",
        "aiayn.model.Transformer",
    ],
)
def _tying_saves_checks():
    def agrees(f, call):
        from aiayn.model import TransformerConfig, parameter_count

        rng = _rng("tying_saves")
        for V, d_model in [(32000, 1024)] + [(rng.randint(1000, 60000), 8 * rng.randint(8, 128)) for _ in range(3)]:
            c = TransformerConfig(vocab_size=V, d_model=d_model)
            _whole(
                call(f, V, d_model),
                parameter_count(c.replace(tie_weights=False)) - parameter_count(c),
                f"tying_saves({V}, {d_model})",
                [
                    (V * d_model, "that is one table; tying replaces three (source, target, pre-softmax) by one"),
                    (3 * V * d_model, "that is all three tables; the one they share remains"),
                ],
            )

    return [("agrees", "what parameter_count says tying saves, for the big model and three sizes drawn", 1, agrees)]


# ----------------------------------------------------------------------------------------------------------
# §3.5 positional encoding, in tensor2tensor's layout
# ----------------------------------------------------------------------------------------------------------


def _timing_signal(max_len, d_model):
    """Reference: sines in the first half, cosines in the second, timescales 1 ... 10^4 spaced geometrically."""
    torch = _torch()
    half = d_model // 2
    inv_timescale = torch.exp(-torch.arange(half, dtype=torch.float64) * math.log(1e4) / (half - 1))
    angle = torch.arange(max_len, dtype=torch.float64)[:, None] * inv_timescale  # (max_len, d_model / 2)
    return torch.cat([angle.sin(), angle.cos()], dim=1)


def _paper_encoding(max_len, d_model):
    torch = _torch()
    angle = torch.arange(max_len, dtype=torch.float64)[:, None] / 10000 ** (
        torch.arange(0, d_model, 2, dtype=torch.float64) / d_model
    )
    return angle, torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1)


@_assignment(
    "positional",
    "Sinusoidal positions, tensor2tensor's layout (§3.5)",
    "positional_encoding",
    ["timing_signal"],
    "timing_signal(max_len, d_model) -> (max_len, d_model): sin(pos / T_i) in dimension i and cos(pos / T_i) "
    "in dimension d_model/2 + i, timescales T_i = 10000^(i / (d_model/2 - 1))",
    [
        "aiayn.positional.sinusoidal_encoding",
        "aiayn.positional.PositionalEncoding.__init__",
        "aiayn.positional.shift_matrix",
    ],
    30,
)
def _positional_checks():
    torch = _torch()

    def pe(call, f, n, d):
        return _tensor(call(f, n, d))

    def wrong_layouts(n, d):
        angle, paper = _paper_encoding(n, d)
        return [
            (
                paper,
                "that is the paper's interleaved layout (sine, cosine, sine, ...); here the sines fill the "
                "first half of the dimensions and the cosines the second",
            ),
            (
                torch.cat([angle.sin(), angle.cos()], 1),
                "the timescales are 10000^(2i / d_model), as in the paper; "
                "here they are 10000^(i / (d_model/2 - 1)), so the last "
                "one is exactly 10000",
            ),
        ]

    def sizes(k: int, n: tuple[int, int], half: tuple[int, int]) -> tuple[int, int]:
        """max_len and d_model drawn afresh by each grading (``SEED``): no table of answers covers them."""
        rng = random.Random(SEED * 16 + k)
        return rng.randint(*n), 2 * rng.randint(*half)

    def shape(f, call):
        n, d = sizes(0, (5, 40), (3, 20))
        out = pe(call, f, n, d)
        _equal(tuple(out.shape), (n, d), f"shape (max_len, d_model) for max_len {n}, d_model {d}")
        if not (out != out[:1]).any():  # (torch.zeros(n, d) has the shape, and encodes nothing)
            raise Failed("every position has the same encoding: the table does not tell positions apart")

    def zero(f, call):
        n, d = sizes(1, (2, 9), (2, 16))
        _close(
            pe(call, f, n, d)[0],
            torch.tensor([0.0] * (d // 2) + [1.0] * (d // 2)),
            f"position 0 is (0, ..., 0, 1, ..., 1) for d_model {d}",
            hints=[
                (
                    torch.tensor([0.0, 1] * (d // 2)),
                    "that is the paper's interleaved layout; here the sines fill the first half",
                )
            ],
        )

    def halves(f, call):
        n, d = sizes(2, (3, 9), (2, 16))
        pos = random.Random(SEED * 16 + 3).randint(1, n - 1)
        _close(
            pe(call, f, n, d)[pos, [0, d // 2]],
            torch.tensor([math.sin(pos), math.cos(pos)]),
            f"PE({pos}, 0) = sin({pos}) and PE({pos}, d_model/2) = cos({pos}) for d_model {d}: sines first, then "
            "cosines",
        )

    def timescales(f, call):
        n, _ = sizes(4, (2000, 4000), (4, 4))
        out = pe(call, f, n, 8)  # T_i = 1, 21.5, 464, 10000
        want = torch.tensor([math.sin((n - 1) / 1e4 ** (i / 3)) for i in range(4)])
        _close(
            out[n - 1, :4],
            want,
            f"PE({n - 1}, i) = sin({n - 1} / 10000^(i/3)) for d_model 8",
            rtol=1e-4,
            atol=1e-4,
            hints=[(w[n - 1, :4], c) for w, c in wrong_layouts(n, 8)],
        )

    def reference(f, call):
        n, d = sizes(5, (20, 80), (8, 48))
        _close(
            pe(call, f, n, d),
            _timing_signal(n, d),
            f"max_len {n}, d_model {d}",
            rtol=1e-4,
            atol=1e-5,
            hints=wrong_layouts(n, d),
        )

    def norm(f, call):
        n, d = sizes(6, (10, 40), (4, 32))
        out = pe(call, f, n, d)
        _close(
            out.norm(dim=-1),
            torch.full((n,), math.sqrt(d / 2)),
            f"every position has norm sqrt(d_model / 2), for max_len {n}, d_model {d}",
            rtol=1e-4,
        )
        if torch.allclose(out, out[:1].expand_as(out)):  # a constant row has that norm too
            raise Failed(
                f"every position has the same vector: the norm is right, but the encoding of max_len {n} "
                "does not change with the position"
            )

    return [
        ("shape", "shape (max_len, d_model), positions told apart", 1, shape),
        ("zero", "position 0 is (0, ..., 0, 1, ..., 1)", 1, zero),
        ("halves", "sines in the first half, cosines in the second", 2, halves),
        ("timescales", "timescales 10000^(i / (d_model/2 - 1))", 2, timescales),
        ("reference", "equals the layout for a max_len and d_model drawn at random", 2, reference),
        ("norm", "norm sqrt(d_model / 2) at every position", 1, norm),
    ]


@_assignment(
    "fit_shift",
    "The shift matrix by least squares (§3.5)",
    "positional_encoding",
    ["fit_shift"],
    "fit_shift(k, d_model) -> (d_model, d_model), the M minimising the sum over positions 0 ... 1999 of "
    "|PE[pos + k] - M PE[pos]|^2",
    ["aiayn.positional.shift_matrix"],
)
def _fit_shift_checks():
    def agrees(f, call):
        from aiayn.positional import shift_matrix

        rng = _rng("fit_shift")  # up to d_model 16 the slowest clocks turn enough in 2000 positions (the exercise)
        for k, d_model in [(3, 16), (rng.randint(1, 40), 2 * rng.randint(2, 8))]:
            want = shift_matrix(k, d_model)
            _close(
                call(f, k, d_model),
                want,
                f"fit_shift({k}, {d_model}) against shift_matrix({k}, {d_model}), to 1e-4",
                rtol=0.0,
                atol=1e-4,
                hints=[(want.T, "that is M transposed: solving rows of the table, X M^T = Y, gives M^T")],
            )

    return [("agrees", "recovers shift_matrix(k, d_model), for the chapter's pair and one drawn at random", 1, agrees)]


# ----------------------------------------------------------------------------------------------------------
# §3.1 the model: the parameters of a decoder layer, and what pre-LN adds
# ----------------------------------------------------------------------------------------------------------


@_assignment(
    "decoder_layer_params",
    "The parameters of a decoder layer, by hand (§3.1)",
    "model",
    ["decoder_layer_params"],
    "decoder_layer_params(d_model, d_ff, h, d_k) -> int, the parameters of one DecoderLayer, as a formula",
    ["aiayn.model.DecoderLayer", "aiayn.model.count_parameters", "aiayn.model.parameter_count"]
    + ["aiayn.multi_head.MultiHeadAttention", "aiayn.feed_forward.PositionwiseFeedForward"]
    + ["aiayn.model.make_model", "aiayn.model.Transformer"],
)
def _decoder_layer_params_checks():
    def agrees(f, call):
        from aiayn.model import DecoderLayer, TransformerConfig, count_parameters

        rng = _rng("decoder_layer_params")
        sizes = [(512, 2048, 8, 48)]  # the chapter's
        sizes += [(d_model, rng.randint(16, 4096), h, d_k) for d_model, h, d_k in [_sizes(rng) for _ in range(2)]]
        for d_model, d_ff, h, d_k in sizes:
            attention, ffn, norm = _projections(d_model, h, d_k), 2 * d_model * d_ff + d_ff + d_model, 2 * d_model
            c = TransformerConfig(d_model=d_model, d_ff=d_ff, h=h, d_k=d_k)
            _whole(
                call(f, d_model, d_ff, h, d_k),
                count_parameters(DecoderLayer(c)),
                f"decoder_layer_params({d_model}, {d_ff}, {h}, {d_k})",
                [
                    (2 * attention + ffn + 2 * norm, "two LayerNorms counted; there are three, one per sublayer"),
                    (2 * attention + ffn, "the three LayerNorms (a gain and a bias of d_model each) are missing"),
                    (
                        attention + ffn + 2 * norm,
                        "that is an encoder layer; a decoder layer has a second attention block, over the "
                        "encoder's output, and a third LayerNorm",
                    ),
                    (attention + ffn + 3 * norm, "one attention block counted; there are two (self, then encoder)"),
                    (
                        2 * _projections(d_model, h, d_k, biases=False) + 2 * d_model * d_ff + 3 * norm,
                        "the biases of the projections are missing",
                    ),
                    (
                        2 * _projections(d_model, 1, d_model) + ffn + 3 * norm,
                        f"that counts h * d_k as d_model; here h * d_k = {h * d_k}, d_model = {d_model}",
                    ),
                ],
            )

    return [("agrees", "the parameters of a DecoderLayer, for the chapter's sizes and two drawn at random", 1, agrees)]


@_assignment(
    "pre_ln_extra_parameters",
    "What pre-LN adds (§3.1)",
    "model",
    ["pre_ln_extra_parameters"],
    "pre_ln_extra_parameters() -> int, the parameters a pre-LN base model has beyond the post-LN one, as the "
    "explanation of the number computes it",
    ["aiayn.model.parameter_count", "aiayn.model.count_parameters"]
    + ["aiayn.model.make_model", "aiayn.model.Transformer"],
)
def _pre_ln_checks():
    def agrees(f, call):
        from aiayn.model import PRESETS, parameter_count

        base = PRESETS["base"]
        want = parameter_count(base.replace(norm_first=True)) - parameter_count(base)
        _whole(
            call(f),
            want,
            "the parameters norm_first=True adds to the base model",
            [
                (0, "pre-LN moves each sublayer's LayerNorm in front of it: a stack's output is left unnormalised"),
                (want // 2, "that is half: count both stacks, and both a LayerNorm's gain and its bias"),
                (want // 4, "that is a quarter: count both stacks, and both a LayerNorm's gain and its bias"),
                (
                    5 * base.N * want // 2,  # 2 sublayers in an encoder layer, 3 in a decoder layer
                    "that is a LayerNorm per sublayer, which post-LN has too: count only what norm_first adds",
                ),
            ],
        )

    return [("agrees", "the parameters norm_first=True adds to the base model", 1, agrees)]


# ----------------------------------------------------------------------------------------------------------
# §4 why self-attention: a band mask, and the reach of causal convolutions
# ----------------------------------------------------------------------------------------------------------


@_assignment(
    "band_mask",
    "Restricted self-attention as a mask (§4)",
    "why_self_attention",
    ["band_mask"],
    "band_mask(n, r) -> bool (n, n), True where |i - j| <= (r - 1)/2: position i may attend to position j",
    ["aiayn.complexity.RestrictedSelfAttention"],
)
def _band_mask_checks():
    torch = _torch()

    def band(n, w):  # |i - j| <= w: RestrictedSelfAttention(2w + 1)'s window, the reference
        i = torch.arange(n)
        return (i[:, None] - i[None, :]).abs() <= w

    def agrees(f, call):
        rng = _rng("band_mask")
        sizes = [(n, rng.randint(0, n - 2)) for n in (rng.randint(4, 12) for _ in range(3))]  # bands narrower than n
        n = rng.randint(2, 12)
        sizes += [(n, rng.randint(n - 1, n + 1)), (1, 0)]  # a window over every position, and a single position
        for n, r in [(n, 2 * w + 1) for n, w in sizes]:
            got, want, what = call(f, n, r), band(n, (r - 1) // 2), f"band_mask({n}, {r})"
            if not isinstance(got, torch.Tensor) or got.dtype != torch.bool or got.shape != want.shape:
                raise Failed(
                    f"{what}: expected a bool tensor of shape {tuple(want.shape)}, got "
                    f"{getattr(got, 'dtype', type(got).__name__)} {tuple(getattr(got, 'shape', ()))}"
                )
            if not torch.equal(got, want):
                half, cause = next((w for w in range(n) if torch.equal(got, band(n, w))), None), ""
                if half is not None:
                    cause = f" (a band of half-width {half}, expected (r - 1)/2 = {(r - 1) // 2})"
                elif torch.equal(got, want.tril()):
                    cause = " (only positions j <= i: the window is centred on i, both sides)"
                elif not got.any():
                    cause = " (no position may attend to any, not even to itself, where |i - j| = 0 <= (r - 1)/2)"
                raise Failed(f"{what}: {int((got != want).sum())} entries differ from the band{cause}")

    return [("agrees", "True exactly where |i - j| <= (r - 1)/2, for n and r drawn at random", 1, agrees)]


@_assignment(
    "causal_layers_needed",
    "The reach of causal convolutions (§4)",
    "why_self_attention",
    ["causal_layers_needed"],
    "causal_layers_needed(j, k) -> int, the causal convolution layers of width k that output position i needs "
    "to depend on input position i - j (at least 1)",
    ["aiayn.complexity.layers_needed"],
)
def _causal_layers_checks():
    def agrees(f, call):
        rng = _rng("causal_layers_needed")
        # the widths of the chapter's gradients, at the distances where a layer is added, then pairs drawn
        cases = sorted({(j, k) for k in (2, 3, 4) for j in (0, 1, k - 1, k, 2 * k - 2, 2 * k - 1)})
        cases += [(rng.randint(0, 400), rng.randint(2, 9)) for _ in range(8)]
        for j, k in cases:
            want = max(1, math.ceil(j / (k - 1)))  # L layers reach L (k - 1) positions back
            _whole(
                call(f, j, k),
                want,
                f"causal_layers_needed({j}, {k})",
                [
                    (0, "at least 1: the output depends on input position i itself through one layer"),
                    (math.ceil(j / k), "a causal kernel of width k reaches k - 1 positions back, not k"),
                    (j // (k - 1), "rounded down: a layer short of the distance does not reach it"),
                    (math.ceil(2 * j / (k - 1)), "that is a centred kernel's count; a causal one reaches k - 1 back"),
                ],
            )

    return [("agrees", "the layers needed for distances j and widths k, a grid and pairs drawn at random", 1, agrees)]


# ----------------------------------------------------------------------------------------------------------
# §5.3 a learning-rate schedule of another shape, and stepping it per optimizer update
# ----------------------------------------------------------------------------------------------------------


def _warmup_cosine(step, peak, warmup, total):
    if step <= warmup:
        return peak * step / warmup
    if step >= total:
        return 0.0
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))


@_assignment(
    "schedule",
    "Warmup, then cosine decay (§5.3)",
    "schedule",
    ["warmup_cosine"],
    "warmup_cosine(step, peak, warmup, total) -> float: linear warmup to peak at step = warmup, then "
    "peak * (1 + cos(pi (step - warmup) / (total - warmup))) / 2, and 0 from step = total on; steps count "
    "optimizer updates from 1",
    ["aiayn.training.rate", "aiayn.training.make_optimizer"],
    20,
)
def _schedule_checks():
    def drawn(k=0):
        """Peak, warmup and total drawn afresh by each grading (``SEED``): no table of answers covers them. The
        warmup is even and the decay a multiple of 4, so that its half and three quarters fall on whole steps."""
        rng = random.Random(f"schedule {SEED} {k}")
        warmup = 2 * rng.randint(20, 400)
        return {"peak": rng.choice([5e-4, 7e-4, 1e-3, 2e-3]) * rng.uniform(0.5, 2), "warmup": warmup,
                "total": warmup + 4 * rng.randint(100, 2000)}  # fmt: skip

    def value(call, f, step, what, peak, warmup, total):
        want, got = _warmup_cosine(step, peak, warmup, total), float(call(f, step, peak, warmup, total))
        if not math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-12):
            cause = ""
            for shift in (-1, 1):
                if step + shift >= 1 and math.isclose(
                    got, _warmup_cosine(step + shift, peak, warmup, total), rel_tol=1e-6, abs_tol=1e-12
                ):
                    cause = f": that is the value of step {step + shift}, one step off (steps count updates from 1)"
            setting = f" (peak {peak:.3g}, warmup {warmup}, total {total})"
            raise Failed(f"{what}, step {step}{setting}: {_relative(got, want)}{cause}")

    def warmup(f, call):
        s = drawn()
        value(call, f, 1, "warmup starts at peak / warmup", **s)
        value(call, f, s["warmup"] // 2, "half-way through the warmup, half the peak", **s)

    def peak(f, call):
        value(call, f, drawn()["warmup"], "the peak at step = warmup", **drawn())
        value(call, f, drawn(1)["warmup"], "the peak at step = warmup", **drawn(1))

    def decay(f, call):
        s = drawn()
        value(call, f, (s["warmup"] + s["total"]) // 2, "half-way through the decay, half the peak", **s)
        value(call, f, (s["warmup"] + 3 * s["total"]) // 4, "a quarter of the decay left", **s)

    def end(f, call):
        s = drawn()
        for step in (s["total"], s["total"] + 1, 5 * s["total"]):
            value(call, f, step, "0 from step = total on", **s)
        # and not before: a schedule that is 0 everywhere ends at 0 too (arguments by position: any names)
        if not float(call(f, s["total"] - 1, s["peak"], s["warmup"], s["total"])) > 0:
            raise Failed(f"step {s['total'] - 1}, one before total = {s['total']}: not above 0, and so not yet ended")

    def grid(f, call):
        settings = [dict(zip(("peak", "warmup", "total"), x)) for x in [(1e-3, 100, 1000), (7e-4, 4000, 100000)]]
        for s in settings + [{"peak": 2.0, "warmup": 1, "total": 10}, drawn(2)]:
            w, t = s["warmup"], s["total"]
            for step in (1, 2, w // 2 + 1, w, w + 1, (w + t) // 3, t - 1, t):
                value(call, f, step, "on a grid of steps and settings", **s)

    return [
        ("warmup", "linear warmup from peak / warmup", 2, warmup),
        ("peak", "the peak at step = warmup", 1, peak),
        ("decay", "cosine decay after the peak", 2, decay),
        ("end", "0 from step = total on, and not before", 1, end),
        ("grid", "equals the schedule on a grid of steps and settings", 2, grid),
    ]


def _noam(s):  # the lr of the s-th update (counted from 1) in the accumulation checks: Equation (3), factor 100
    return 100.0 * 16**-0.5 * min(s**-0.5, s * 10**-1.5)


@_assignment(
    "accumulation",
    "Gradient accumulation, the schedule stepped per update (§5.3)",
    "schedule",
    ["my_train_epoch"],
    "my_train_epoch(model, batches, optimizer, scheduler, accum) -> None; model(batch) returns the mean "
    "loss of a micro-batch; one optimizer update per `accum` micro-batches",
    ["aiayn.training.train"],
    30,
)
def _accumulation_checks():
    torch = _torch()

    def setup(n_batches=8):
        torch.manual_seed(SEED)
        net = torch.nn.Linear(3, 1)
        batches = [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(n_batches)]
        opt = inputs.Recording(net.parameters(), lr=1.0)
        return inputs.SquaredError(net), batches, opt, inputs.Scheduler(opt, inputs.Noam())

    def run(f, call):
        """What the optimizer saw ([(lr, grads)]), how often the scheduler stepped, and the final weights."""
        model, batches, opt, sched = setup()
        _, after = call(f, model, batches, opt, sched, 4, _observe=True)
        return after[2]["seen"], after[3]["last_epoch"], after[0]["params"]

    def updates(f, call):
        seen, _, _ = run(f, call)
        _equal(len(seen), 2, "optimizer updates for 8 micro-batches with accum=4")

    def per_update(f, call):
        seen, steps, _ = run(f, call)
        lrs = [lr for lr, _ in seen]
        if len(lrs) != 2 or not all(abs(a - b) <= 1e-12 * b for a, b in zip(lrs, (_noam(1), _noam(2)))):
            raise Failed(
                f"updates 1 and 2 must use the learning rates of steps 1 and 2, {_noam(1):.4g} and "
                f"{_noam(2):.4g}; they used {', '.join(f'{x:.4g}' for x in lrs) or 'none'}"
                + (f" (the scheduler was stepped {steps} times, once per micro-batch)" if steps == 8 else "")
            )
        _equal(steps, 2, "scheduler steps for 2 updates")

    def averaged(f, call):
        seen, _, final = run(f, call)
        _equal(len(seen), 2, "optimizer updates")
        model, batches, _, _ = setup()
        w = [p.detach().clone() for p in model.net.parameters()]
        for n, (lr, grads) in enumerate(seen):
            for p in w:
                p.requires_grad_(True)
            group = batches[4 * n : 4 * n + 4]
            loss = sum(((b[0] @ w[0].T + w[1]) - b[1]).pow(2).mean() for b in group) / 4
            want = torch.autograd.grad(loss, w)
            for g, gw in zip(grads, want, strict=True):
                _close(
                    g,
                    gw,
                    f"update {n + 1}: the gradient must be the mean over its 4 micro-batches",
                    hints=[(4 * gw, "the gradient is the sum, not the mean, of the micro-batch gradients")],
                )
            w = [(p - lr * g).detach() for p, g in zip(w, want)]
        _equal(len(final), len(w), "parameters")
        # one tensor, and float32's rounding of updates of order 1: a weight that ends near 0 is not held to less
        _close(torch.cat([p.flatten() for p in final]), torch.cat([q.flatten() for q in w]), "final weights", atol=1e-6)

    return [
        ("updates", "one optimizer update per accum micro-batches", 2, updates),
        ("per_update", "schedule stepped once per optimizer update, not per micro-batch", 3, per_update),
        ("averaged", "gradients averaged over an update's micro-batches, then zeroed", 2, averaged),
    ]


@_assignment(
    "peak",
    "The schedule's peak in closed form (§5.3)",
    "training",
    ["peak"],
    "peak(d_model, warmup, factor) -> float, the largest value of rate(step, d_model, warmup, factor) over all steps",
    ["aiayn.training.rate", "aiayn.results.peak_lr"],  # (the results chapter's closed form, from a run's settings)
)
def _peak_checks():
    def agrees(f, call):
        from aiayn.training import rate

        for k in range(4):
            rng = _rng("peak", k)
            d_model, warmup, factor = rng.randint(16, 2048), rng.randint(100, 16000), round(rng.uniform(0.5, 4), 2)
            want = max(rate(s, d_model, warmup, factor) for s in (warmup - 1, warmup, warmup + 1))  # it peaks there
            got, what = float(call(f, d_model, warmup, factor)), f"peak({d_model}, {warmup}, {factor})"
            if not math.isclose(got, want, rel_tol=1e-6):
                causes = [
                    (want / factor, "factor is not applied"),
                    (want / warmup, "that is the warmup's slope; the peak is the rate at step = warmup"),
                    (want * math.sqrt(d_model), "d_model^-0.5 is missing"),
                ]
                cause = next((f": {why}" for wrong, why in causes if math.isclose(got, wrong, rel_tol=1e-6)), "")
                raise Failed(f"{what}: {_relative(got, want)}{cause}")

    return [("agrees", "the largest value of rate, for settings drawn at random", 1, agrees)]


# ----------------------------------------------------------------------------------------------------------
# §5.4 label smoothing, with the uniform part over every token but padding
# ----------------------------------------------------------------------------------------------------------


def _smoothed_target(target, V, eps, pad):
    """Reference target distribution: (1 - eps) one-hot + eps uniform over the V - 1 tokens that are not padding."""
    torch = _torch()
    q = torch.full((*target.shape, V), eps / (V - 1), dtype=torch.float64)
    q[..., pad] = 0.0
    q.scatter_add_(-1, target[..., None], torch.full((*target.shape, 1), 1.0 - eps, dtype=torch.float64))
    return q


def _smoothed_loss(logits, target, eps, pad):
    q = _smoothed_target(target, logits.size(-1), eps, pad)
    loss = -(q * logits.double().log_softmax(-1)).sum(-1)
    return loss.masked_fill(target == pad, 0.0).sum()


@_assignment(
    "label_smoothing",
    "Label smoothing as Szegedy et al. wrote it (§5.4)",
    "label_smoothing",
    ["my_label_smoothing", "MyLabelSmoothingLoss"],
    "my_label_smoothing(logits, target, eps_ls, pad_id) (or MyLabelSmoothingLoss(eps_ls, pad_id)(logits, "
    "target)) -> the summed loss over non-pad positions against (1 - eps_ls) one-hot + eps_ls uniform over "
    "the V - 1 tokens other than padding",
    ["aiayn.training.LabelSmoothingLoss.forward", "aiayn.training.LabelSmoothingLoss.target_distribution"]
    + ["torch._C._nn.cross_entropy_loss"],  # PyTorch's own, when its label_smoothing is not 0 (kernel.Watch)
    30,
)
def _label_smoothing_checks():
    torch = _torch()

    def loss(call, f, logits, target, eps=0.1, pad=0, grad=False):
        """The student's loss (and, with ``grad``, its gradient with respect to the logits)."""
        return call(f, logits.clone(), target.clone(), _init=(eps, pad), _grad=0 if grad else None)

    def data(seed=0, V=11):
        g = torch.Generator().manual_seed(SEED + seed)
        logits = torch.randn(2, 5, V, generator=g)
        target = torch.randint(1, V, (2, 5), generator=g)
        target[1, 3:] = 0
        return logits, target

    def q_from_grad(call, f, V=11):
        """The target distribution, read off the gradient: d loss / d logits = softmax - q per non-pad row."""
        logits, target = data(1, V)
        _, grad = loss(call, f, logits, target, grad=True)
        return (logits.softmax(-1) - grad).double(), target

    def uniform(f, call):
        _close(
            loss(call, f, torch.zeros(1, 3, 5), torch.tensor([[3, 4, 0]])),
            2 * math.log(5),
            "uniform logits cost log V per non-pad token, summed (2 tokens, V = 5)",
        )

    def true_token(f, call):
        q, target = q_from_grad(call, f)
        keep = target != 0
        got = q.gather(-1, target[..., None])[..., 0][keep]
        want = torch.full_like(got, 0.9 + 0.1 / 10)
        _close(
            got,
            want,
            "the true token's target probability is 1 - eps_ls + eps_ls / (V - 1) = 0.91",
            hints=[
                (
                    torch.full_like(got, 0.9),
                    "it gets 1 - eps_ls, as in the book's LabelSmoothingLoss; here the "
                    "uniform part covers the true token too",
                ),
                (
                    torch.full_like(got, 0.9 + 0.1 / 11),
                    "eps_ls is spread over all V tokens, padding included (PyTorch's label_smoothing)",
                ),
            ],
        )

    def no_pad(f, call):
        q, target = q_from_grad(call, f)
        got = q[..., 0][target != 0]
        if not got.abs().max() <= 1e-6:  # (NaN too)
            raise Failed(f"the padding token gets target probability {got.max():.4g}; it must get 0")

    def spread(f, call):
        q, target = q_from_grad(call, f)
        keep = target != 0
        other = torch.ones_like(q, dtype=torch.bool)
        other[..., 0] = False
        other.scatter_(-1, target[..., None], False)
        got = q[other & keep[..., None]]
        _close(
            got,
            torch.full_like(got, 0.1 / 10),
            "every other token gets eps_ls / (V - 1) = 0.01",
            hints=[
                (
                    torch.full_like(got, 0.1 / 9),
                    "eps_ls is spread over V - 2 tokens (the book's formula); here "
                    "over the V - 1 tokens that are not padding",
                )
            ],
        )

    def padding_rows(f, call):
        logits, target = data(2)
        _, grad = loss(call, f, logits, target, grad=True)
        _close(
            grad[target == 0],
            torch.zeros_like(grad[target == 0]),
            "positions whose target is padding must not contribute",
        )
        if (grad[target != 0].abs().sum(-1) == 0).any():  # a loss that ignores its logits contributes nothing either
            raise Failed("positions whose target is not padding must contribute: the loss ignores their logits")

    def finite(f, call):
        outs = []
        for confident in ([2, 2, 2], [2, 5, 2]):  # the second position wrong, then right
            logits = torch.full((1, 3, 7), -1e4)
            logits[0, torch.arange(3), confident] = 1e4
            outs.append(torch.as_tensor(loss(call, f, logits, torch.tensor([[2, 5, 0]]))))
            if not torch.isfinite(outs[-1]).all():
                why = "compute it from log_softmax, not log(softmax)"
                raise Failed(f"the loss is {float(outs[-1].sum())} for confident logits: {why}")
        if not outs[1].sum() < outs[0].sum():
            raise Failed("confident logits on the true tokens must cost less than on a wrong one")

    def reference(f, call):
        for eps, V in [(0.1, 11), (0.3, 6)]:
            logits, target = data(3, V)
            _close(
                loss(call, f, logits, target, eps),
                _smoothed_loss(logits, target, eps, 0),
                f"eps_ls {eps}, V {V}",
                rtol=1e-5,
            )

    def plain(f, call):
        logits, target = data(4)
        want = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1).double(), target.flatten(), ignore_index=0, reduction="sum"
        )
        _close(
            loss(call, f, logits, target, 0.0),
            want,
            "eps_ls = 0 is the cross-entropy",
            rtol=1e-5,
            hints=[(want / int((target != 0).sum()), "the loss is averaged; it must be summed over the tokens")],
        )

    return [
        ("uniform", "uniform logits: log V per token (known value)", 1, uniform),
        ("true_token", "the true token gets 1 - eps_ls + eps_ls / (V - 1)", 2, true_token),
        ("no_pad", "no probability on the padding token", 2, no_pad),
        ("spread", "every other token gets eps_ls / (V - 1)", 1, spread),
        ("padding_rows", "padding positions contribute nothing", 2, padding_rows),
        ("finite", "finite for confident logits (no log 0)", 1, finite),
        ("reference", "equals the smoothed loss for two settings", 2, reference),
        ("plain", "eps_ls = 0 is the summed cross-entropy", 1, plain),
    ]


@_assignment(
    "kl_smoothed",
    "Label smoothing as a KL divergence (§5.4)",
    "training",
    ["kl_smoothed"],
    "kl_smoothed(logits, target, eps_ls=0.1, pad_id=0) -> the KL divergence from the book's smoothed target q "
    "(LabelSmoothingLoss.target_distribution) to softmax(logits), summed over the non-pad positions",
    # none: the exercise builds on LabelSmoothingLoss, and its result differs from the loss's by H(q)
)
def _kl_smoothed_checks():
    torch = _torch()

    def data(k):
        rng = _rng("kl_smoothed", k)
        V, pad = rng.randint(6, 30), rng.randrange(6) if k else 0
        g = torch.Generator().manual_seed(SEED + k)
        logits = 3 * torch.randn(rng.randint(2, 3), rng.randint(3, 7), V, generator=g)
        target = torch.tensor([[rng.choice([t for t in range(V) if t != pad]) for _ in row] for row in logits[..., 0]])
        target[0, -rng.randint(1, 2) :] = pad  # a sentence ends in padding
        return logits, target, ((round(rng.uniform(0.05, 0.3), 3), pad) if k else ())  # k = 0: the defaults

    def q(target, V, eps=0.1, pad=0, rows=True):
        """The book's smoothed target, float64; ``rows=False``: with the padding positions' rows left in."""
        from aiayn.training import LabelSmoothingLoss

        dist = LabelSmoothingLoss(eps, pad).target_distribution(target, V).double()
        if not rows:
            dist = torch.full_like(dist, eps / (V - 2)).index_fill(-1, torch.tensor([pad]), 0.0)
            dist.scatter_(-1, target[..., None], 1.0 - eps)
        return dist

    def kl(logits, q):
        return (torch.xlogy(q, q) - q * logits.double().log_softmax(-1)).sum()

    def agrees(f, call):
        for k in range(2):
            logits, target, settings = data(k)
            V, eps, pad = logits.size(-1), *(settings or (0.1, 0))
            target_q, logp = q(target, V, eps, pad), logits.double().log_softmax(-1)
            want = kl(logits, target_q)
            what = f"eps_ls {eps}, pad_id {pad}, V {V}" + (" (the defaults)" if not settings else "")
            _close(
                call(f, logits.clone(), target.clone(), *settings),
                want,
                what,
                hints=[
                    (-(target_q * logp).sum(), "that is the cross-entropy, larger than the KL divergence by H(q)"),
                    (
                        (torch.xlogy(target_q, target_q) - target_q * logits.double()).sum(),
                        "F.kl_div takes log-probabilities: pass logits.log_softmax(-1), not the logits",
                    ),
                    (want / logits.size(0), "reduction='batchmean' divides by the batch size; the loss is summed"),
                    (want / logits.numel(), "reduction='mean' averages over every entry; the loss is summed"),
                    (kl(logits, q(target, V, 0.1, pad)), "eps_ls is ignored: that is the KL for eps_ls = 0.1"),
                    (kl(logits, q(target, V, eps, pad, rows=False)), "padding positions must not contribute"),
                ],
            )

    return [("agrees", "the summed KL divergence, for the defaults and settings drawn at random", 1, agrees)]


# ----------------------------------------------------------------------------------------------------------
# §5.1 batches: padding and teacher forcing
# ----------------------------------------------------------------------------------------------------------


@_assignment(
    "padding_fraction",
    "The padding fraction (§5.1)",
    "data",
    ["my_padding_fraction"],
    "my_padding_fraction(batches, lengths) -> float, the share of padded source and target positions that are padding",
    ["aiayn.batching.padding_fraction", "aiayn.batching.padded_tokens"],
)
def _padding_fraction_checks():
    def fraction(batches, lengths):
        padded = sum(len(b) * (max(lengths[i][0] for i in b) + max(lengths[i][1] for i in b)) for b in batches)
        return 1 - sum(sum(lengths[i]) for b in batches for i in b) / padded

    def agrees(f, call):
        lengths = [(3, 4), (5, 2), (1, 1), (7, 6), (2, 9)]
        cases = [(b, lengths) for b in ([[0, 1, 2, 3, 4]], [[0], [1], [2], [3], [4]], [[0, 2], [1, 3, 4]])]
        rng = _rng("padding_fraction")  # and sentences and batches drawn anew for each grading
        drawn = [(rng.randint(1, 40), rng.randint(1, 40)) for _ in range(rng.randint(6, 12))]
        order = rng.sample(range(len(drawn)), len(drawn))
        cases.append(([order[i : i + 3] for i in range(0, len(order), 3)], drawn))
        for batches, lengths in cases:
            want = fraction(batches, lengths)
            got = float(call(f, [list(b) for b in batches], list(lengths)))
            if not math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12):
                raise Failed(f"batches {batches} of the lengths {lengths}: {_relative(got, want)}")

    return [("agrees", "the padding fraction of three batchings, and of one drawn at random", 1, agrees)]


@_assignment(
    "shift",
    "Teacher forcing for one sentence (§5.1)",
    "data",
    ["shift"],
    "shift(y, bos_id, eos_id) -> ([bos_id] + y, y + [eos_id])",
    ["aiayn.batching.collate"],
)
def _shift_checks():
    def agrees(f, call):
        rng = _rng("shift")  # and a sentence and its ids drawn anew for each grading
        drawn = ([rng.randint(3, 8000) for _ in range(rng.randint(2, 12))], rng.randint(3, 20), rng.randint(21, 40))
        for y, bos, eos in [([5, 6, 7], 1, 2), ([9], 1, 2), ([], 1, 2), drawn]:
            got = call(f, list(y), bos, eos)
            _equal(tuple(list(map(int, part)) for part in got), ([bos, *y], [*y, eos]), f"shift({y}, {bos}, {eos})")

    return [("agrees", "decoder input and output for three sentences, and one drawn at random", 1, agrees)]


# ----------------------------------------------------------------------------------------------------------
# §6.1 decoding: the length penalty, greedy search with a minimum length
# ----------------------------------------------------------------------------------------------------------


@_assignment(
    "length_penalty",
    "The length penalty (§6.1)",
    "decoding",
    ["my_length_penalty"],
    "my_length_penalty(length, alpha) -> ((5 + length) / 6) ** alpha, for a tensor of lengths",
    ["aiayn.decoding.length_penalty"],
)
def _length_penalty_checks():
    torch = _torch()

    def agrees(f, call):
        lengths = torch.arange(0, 60, dtype=torch.float64)
        rng = _rng("length_penalty", 0)  # and lengths and an alpha drawn anew for each grading
        drawn = [
            (torch.tensor([float(rng.randint(0, 500)) for _ in range(40)], dtype=torch.float64), rng.uniform(0, 3))
        ]
        for lengths, alpha in [(lengths, a) for a in (0.0, 0.6, 1.0, 2.0)] + drawn:
            want = ((5.0 + lengths) / 6.0) ** alpha
            _close(call(f, lengths.clone(), alpha), want, f"alpha {alpha:.4g}", rtol=1e-9)

    return [("agrees", "GNMT's length penalty for lengths 0 to 59 and four alphas, and drawn ones", 1, agrees)]


BOS, EOS, PAD = inputs.BOS, inputs.EOS, inputs.PAD
_table_model = inputs.TableModel  # the stand-in model the greedy checks decode with


def _as_sequences(out) -> list[list[int]]:
    """Decoder output (tensor or lists, with or without <s>, padded or not) -> token lists up to </s>."""
    if isinstance(out, tuple):
        out = out[0]
    rows = out.tolist() if hasattr(out, "tolist") else [list(r) for r in out]
    seqs = []
    for row in rows:
        row = [int(t) for t in (row.tolist() if hasattr(row, "tolist") else row)]
        if row and row[0] == BOS:
            row = row[1:]
        if EOS in row:
            row = row[: row.index(EOS)]
        seqs.append([t for t in row if t != PAD])
    return seqs


def _greedy(model, src, max_len, min_len=0):
    """Reference: from <s>, the most probable token other than <pad> and <s>, </s> barred before min_len tokens,
    until </s> or max_len tokens."""
    torch = _torch()
    memory, src_mask = model.encode(src)
    ys = torch.full((src.size(0), 1), BOS, dtype=torch.long)
    for t in range(max_len):
        logits = model.generator(model.decode(ys, memory, src_mask)[:, -1]).clone()
        logits[:, [PAD, BOS]] = -math.inf
        if t < min_len:
            logits[:, EOS] = -math.inf
        ys = torch.cat([ys, logits.argmax(-1, keepdim=True)], dim=1)
        if (ys == EOS).any(1).all():
            break
    return _as_sequences(ys)


@_assignment(
    "greedy",
    "Greedy decoding with a minimum length (§6.1)",
    "greedy_and_bleu",
    ["my_greedy_decode"],
    "my_greedy_decode(model, src, max_len, min_len=0) -> token ids, one row or list per sentence: from <s> "
    "(id 1), the most probable token other than <pad> (0) and <s>, never </s> (id 2) before min_len tokens, "
    "until </s> or max_len tokens",
    [
        "aiayn.decoding.greedy_decode",
        "aiayn.decoding.beam_search",
        "aiayn.training.greedy",
        "aiayn.browser.beam_search",
    ],
    40,
)
def _greedy_checks():
    torch = _torch()

    def decode(call, f, model, src, max_len, **kw):
        with torch.no_grad():
            return _as_sequences(call(f, model, src.clone(), max_len, **kw))

    def tokens(check):
        """Token ids (neither padding, <s> nor </s>) and a source sentence, drawn afresh for each grading, so that
        the stand-in model's answers cannot be written out beforehand."""
        rng = random.Random(f"greedy {SEED} {check}")
        return rng.sample(range(3, 10), 4), torch.tensor([rng.sample(range(3, 10), rng.randint(2, 5))])

    def chain(f, call):
        (a, b, c, _), src = tokens("chain")
        model = _table_model({BOS: {a: 5.0}, a: {b: 5.0}, b: {c: 5.0}, c: {EOS: 5.0}})
        _equal(decode(call, f, model, src, 20), [[a, b, c]], f"the most likely tokens are {a}, {b}, {c}, then </s>")

    def batch(f, call):
        (a, *_), src = tokens("batch")
        model = _table_model({BOS: {a: 5.0}, a: {EOS: 5.0}})
        src = src.repeat(2, 1)
        src[1, 1:] = PAD  # the second sentence: one token, then padding
        _equal(decode(call, f, model, src, 20), [[a], [a]], "two source sentences give two outputs")

    def stops(f, call):
        (a, b, *_), src = tokens("stops")
        model = _table_model({BOS: {a: 5.0}, a: {b: 5.0}, b: {a: 5.0}})  # never ends
        got = decode(call, f, model, src, 7)
        if len(got) != 1 or not 6 <= len(got[0]) <= 7 or got[0][:6] != [a, b, a, b, a, b]:
            raise Failed(f"without </s> the output must stop after max_len = 7 tokens; got {got}")

    def min_len(f, call):
        (a, b, c, _), src = tokens("min_len")
        model = _table_model({BOS: {EOS: 5.0, a: 2.0}, a: {EOS: 5.0, b: 2.0}, b: {EOS: 5.0, c: 2.0}})
        _equal(
            decode(call, f, model, src, 10, min_len=2),
            [[a, b]],
            "</s> is barred for the first 2 tokens (min_len=2), then it is the most likely",
        )
        _equal(decode(call, f, model, src, 10), [[]], "with min_len=0, </s> may come first")

    def real(f, call):
        from aiayn.model import make_model

        src = torch.tensor([[5, 6, 7, 8, 9], [9, 8, 7, 0, 0]])
        for seed in range(SEED, SEED + 1000):  # a model with </s> in its first 4 tokens, so that min_len matters
            torch.manual_seed(seed)
            model = make_model("base", vocab_size=16, N=1, d_model=32, d_ff=64, h=4, P_drop=0.0, max_len=64).eval()
            with torch.no_grad():
                if min(map(len, _greedy(model, src, 10))) < 4:
                    break
        with torch.no_grad():
            for kw in ({}, {"min_len": 4}):
                want = _greedy(model, src, 10, **kw)
                _equal(
                    decode(call, f, model, src, 10, **kw),
                    want,
                    f"a small random model, max_len 10, {kw or 'min_len 0'}",
                )

    return [
        ("chain", "follows the most likely token (known chain)", 3, chain),
        ("batch", "one output per source sentence", 1, batch),
        ("stops", "stops after max_len tokens when no </s> comes", 1, stops),
        ("min_len", "no </s> before min_len tokens", 2, min_len),
        ("real", "equals greedy decoding on a small model", 2, real),
    ]


# ----------------------------------------------------------------------------------------------------------
# §6.1 BLEU: its parts, and corpus BLEU with add-one smoothing
# ----------------------------------------------------------------------------------------------------------


def _ngrams(tokens, n):
    from collections import Counter

    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


@_assignment(
    "clipped_matches",
    "Modified n-gram precision (§6.1)",
    "decoding",
    ["clipped_matches"],
    "clipped_matches(hyp, ref, n) -> (clipped n-gram matches, n-grams of hyp), token lists",
    ["aiayn.bleu.ngram_stats", "aiayn.bleu.ngrams", "sacrebleu.metrics.bleu.BLEU"]
    + ["sacrebleu.metrics.helpers.extract_all_word_ngrams", "sacrebleu.metrics.helpers.extract_word_ngrams"]
    # and its character n-grams (chrF's), one character per token
    + ["sacrebleu.metrics.helpers.extract_all_char_ngrams", "sacrebleu.metrics.helpers.extract_char_ngrams"]
    + ["sacrebleu.metrics.chrf.CHRF"],
)
def _clipped_checks():
    def agrees(f, call):
        cases = [
            ("the the the the".split(), "the cat sat on the mat".split()),
            ("a man rides a bike on a road".split(), "a man rides a bicycle on a street".split()),
            ([], "a b c".split()),
            ("a b".split(), []),
        ]
        rng, words = _rng("clipped_matches", 0), "a the man dog runs on red grass ball".split()  # drawn per grading
        cases += [[[rng.choice(words) for _ in range(rng.randint(3, 14))] for _ in "hr"] for _ in range(4)]
        for hyp, ref in cases:
            for n in range(1, 5):
                h, r = _ngrams(hyp, n), _ngrams(ref, n)
                want = (sum(min(c, r[g]) for g, c in h.items()), sum(h.values()))
                got = call(f, list(hyp), list(ref), n)
                cause = ""
                if tuple(got) == (sum(c for g, c in h.items() if g in r), want[1]):
                    cause = " (the counts are not clipped at the reference's count)"
                if tuple(got) != want:
                    raise Failed(
                        f"n = {n}, hyp {' '.join(hyp)!r}, ref {' '.join(ref)!r}: got {tuple(got)}, expected "
                        f"{want}{cause}"
                    )

    return [("agrees", "clipped matches and totals for four pairs, four drawn ones, and n = 1..4", 1, agrees)]


@_assignment(
    "brevity_penalty",
    "The brevity penalty (§6.1)",
    "decoding",
    ["my_brevity_penalty"],
    "my_brevity_penalty(c, r) -> 1 if c >= r (so 1 when c = r = 0), else exp(1 - r / c); 0 for c = 0 < r",
    ["aiayn.bleu.brevity_penalty", "sacrebleu.metrics.bleu.BLEU"],
)
def _bp_checks():
    def agrees(f, call):
        rng = _rng("brevity_penalty", 0)  # and lengths drawn for each grading, the hypothesis shorter or longer
        drawn = [(rng.randint(1, 5000), rng.randint(1, 5000)) for _ in range(6)]
        for c, r in [(10, 10), (12, 10), (9, 10), (1, 30), (0, 5), (0, 0)] + drawn:
            want = 1.0 if c >= r else (math.exp(1 - r / c) if c else 0.0)
            got = float(call(f, c, r))
            if not math.isclose(got, want, rel_tol=1e-12):
                raise Failed(f"c = {c}, r = {r}: {_relative(got, want)}")

    return [("agrees", "BP for six pairs of lengths and six drawn ones", 1, agrees)]


BLEU_REFERENCES = [
    "aiayn.bleu.corpus_bleu",
    "aiayn.bleu.bleu_from_stats",
    "aiayn.bleu.ngram_stats",
    "sacrebleu.corpus_bleu",
    "sacrebleu.sentence_bleu",
    "sacrebleu.metrics.bleu.BLEU.corpus_score",
    "sacrebleu.metrics.bleu.BLEU.sentence_score",
    "sacrebleu.metrics.bleu.BLEU.compute_bleu",
    "sacrebleu.metrics.helpers.extract_all_word_ngrams",
    "sacrebleu.metrics.helpers.extract_word_ngrams",
    "aiayn.bleu.ngrams",
    "aiayn.bleu.brevity_penalty",
]


def _add_one_bleu(hyps, refs, split=None):
    """Reference: corpus BLEU on 13a tokens (or those of ``split``), p_n = (m_n + 1) / (t_n + 1) for n = 2..4 (Lin
    and Och, 2004)."""
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    tok = Tokenizer13a()
    split = split or (lambda text: tok(text).split())
    m, t, c, r = [0] * 4, [0] * 4, 0, 0
    for hyp, ref in zip(hyps, refs):
        h, g = split(hyp), split(ref)
        c, r = c + len(h), r + len(g)
        for n in range(1, 5):
            hc, rc = _ngrams(h, n), _ngrams(g, n)
            m[n - 1] += sum(min(k, rc[x]) for x, k in hc.items())
            t[n - 1] += sum(hc.values())
    if m[0] == 0:
        return 0.0
    log_p = math.log(m[0] / t[0]) + sum(math.log((m[n] + 1) / (t[n] + 1)) for n in range(1, 4))
    bp = 1.0 if c >= r else math.exp(1 - r / c)
    return 100 * bp * math.exp(log_p / 4)


@_assignment(
    "bleu",
    "Corpus BLEU with add-one smoothing (§6.1)",
    "greedy_and_bleu",
    ["add_one_bleu"],
    "add_one_bleu(hyps: list[str], refs: list[str]) -> BLEU in [0, 100] on sacreBLEU's 13a tokens, with "
    "p_n = (m_n + 1) / (t_n + 1) for n = 2, 3, 4",
    BLEU_REFERENCES,
    45,
)
def _bleu_checks():
    def respelled(*groups: list[str]) -> list[list[str]]:
        """The sentences with every word spelled anew for each grading (``SEED``), the same word the same way
        wherever it occurs, and a full stop attached to the word before it, as text has it ("street."): the n-gram
        matches are those of the sentences as written, the words new, and the tokens 13a's."""

        def word(w):
            if not w.isalpha():
                return w
            rng = random.Random(f"{SEED} {w}")  # the word's spelling depends on the word and the seed alone
            return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9)))

        return [[" ".join(map(word, x.split())).replace(" .", ".") for x in group] for group in groups]

    refs = [
        "The cat sat on the mat .",
        "A man is riding a red bicycle down the street .",
        "Two dogs play in the snow .",
        "Children are watching a puppet show in the park .",
    ]

    def score(call, f, hyps, rs):
        out = call(f, list(hyps), list(rs))
        return float(getattr(out, "score", out))

    def close(call, f, hyps, rs, what):
        got, want = score(call, f, hyps, rs), _add_one_bleu(hyps, rs)
        if not math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9):
            import sacrebleu

            cause = ""
            if math.isclose(got, sacrebleu.corpus_bleu(hyps, [rs]).score, rel_tol=1e-6):
                cause = ": that is BLEU with sacreBLEU's default 'exp' smoothing; here every p_n for n >= 2 is smoothed"
            elif math.isclose(got, sum(_add_one_bleu([h], [r]) for h, r in zip(hyps, rs)) / len(hyps), rel_tol=1e-6):
                cause = ": that is the mean of sentence scores; corpus BLEU pools the counts over the sentences first"
            elif math.isclose(got, _add_one_bleu(hyps, rs, str.split), rel_tol=1e-6):
                cause = ": that is BLEU on words split at spaces; 13a splits a full stop from its word"
            raise Failed(f"{what}: {_relative(got, want)}{cause}")

    def identical(f, call):
        (rs,) = respelled(refs)
        close(call, f, rs, rs, "identical hypotheses and references score 100")

    def drawn(check):  # each grading draws its own lengths and edits (and spellings): no score can be written out
        return random.Random(f"bleu {SEED} {check}")

    def brevity(f, call):
        rng = drawn("brevity")
        hyps = [" ".join(r.split()[: rng.randint(3, len(r.split()) - 2)]) for r in refs]  # each cut short
        close(call, f, *respelled(hyps, refs), "short hypotheses: the brevity penalty")

    def smoothing(f, call):
        n, m = drawn("smoothing").randint(4, 8), drawn("smoothing 2").randint(2, 5)
        hyps = [" ".join(f"h{i}" for i in range(n)), " ".join(f"g{i}" for i in range(m))]
        rs = [" ".join(f"h{i}" if i % 2 == 0 else f"r{i}" for i in range(n)), " ".join(["z"] * m)]
        close(call, f, *respelled(hyps, rs), "no bigram matches: add-one smoothing")

    def corpus(f, call):
        rng = drawn("corpus")
        edits = [[w for w in r.split() if rng.random() > 0.25] + ["red"] * (rng.random() > 0.5) for r in refs]
        close(call, f, *respelled([" ".join(e) for e in edits], refs), "counts pooled over the corpus")

    def random_corpus(f, call):
        rng = random.Random(SEED + 1)
        words = "a man woman dog cat runs sits on the in park street red blue , .".split()
        rs = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 14))) for _ in range(40)]
        hyps = [
            " ".join(w for w in x.split() if rng.random() > 0.2) + (" blue" if rng.random() > 0.5 else "") for x in rs
        ]
        hyps, rs = respelled(hyps, rs)
        close(call, f, hyps, rs, "a random corpus of 40 sentences")

    return [
        ("identical", "an identical corpus scores 100", 1, identical),
        ("brevity", "the brevity penalty", 2, brevity),
        ("smoothing", "add-one smoothing where no bigram matches", 2, smoothing),
        ("corpus", "n-gram counts pooled over the corpus", 2, corpus),
        ("random", "a random corpus of 40 sentences", 2, random_corpus),
    ]


# ----------------------------------------------------------------------------------------------------------
# §6.1 results: repetitions
# ----------------------------------------------------------------------------------------------------------


@_assignment(
    "repeats",
    "Repeated words (§6.1)",
    "results",
    ["my_repeats"],
    "my_repeats(sentence, times=3) -> True when some word occurs `times` times in a row",
    ["aiayn.results.repeats"],
)
def _repeats_checks():
    def agrees(f, call):
        rng = _rng("repeats")  # and a sentence drawn anew for each grading: runs of 1 to 4 of few words
        runs = [[rng.choice(["ein", "der", "Hund", "a"])] * rng.randint(1, 4) for _ in range(rng.randint(3, 6))]
        drawn = " ".join(w for run in runs for w in run)
        for sentence in [
            "ein Mann einem einem einem",
            "ein ein Mann",
            "",
            "a a a",
            "a b a b a b",
            "Hund Hund Hund Hund",
            drawn,
        ]:
            for times in (2, 3, 4):
                words = sentence.split()
                want = any(len(set(words[i : i + times])) == 1 for i in range(len(words) - times + 1))
                _equal(bool(call(f, sentence, times)), want, f"my_repeats({sentence!r}, {times})")

    return [("agrees", "six sentences and one drawn at random, 2 to 4 repetitions", 1, agrees)]


# ----------------------------------------------------------------------------------------------------------
# §6.2 variations: the parameter count of a configuration, by hand
# ----------------------------------------------------------------------------------------------------------


def _parameter_count(c, biases=True, norms=True, tied=True) -> int:
    """Reference: the parameters of a post-LN Transformer with sinusoidal positions and three-way tied embeddings."""
    d, dk, h = c.d_model, c.d_k or c.d_model // c.h, c.h
    attention = 4 * d * h * dk + (3 * h * dk + d) * biases  # W_Q, W_K, W_V, W_O (and their biases)
    ffn = 2 * d * c.d_ff + (c.d_ff + d) * biases
    norm = 2 * d * norms  # a LayerNorm's gain and bias
    embeddings = c.vocab_size * d * (1 if tied else 3)
    return embeddings + c.N * (attention + ffn + 2 * norm) + c.N * (2 * attention + ffn + 3 * norm)


@_assignment(
    "parameter_count",
    "Parameters by hand (§6.2)",
    "variations",
    ["my_parameter_count"],
    "my_parameter_count(c: TransformerConfig) -> int, the parameters of make_model(c) with tied weights "
    "and sinusoidal positions",
    ["aiayn.model.parameter_count", "aiayn.model.count_parameters", "aiayn.model.make_model", "aiayn.model.Transformer"]
    + ["aiayn.model.Encoder", "aiayn.model.Decoder", "aiayn.model.EncoderLayer", "aiayn.model.DecoderLayer"]
    + ["aiayn.multi_head.MultiHeadAttention", "aiayn.feed_forward.PositionwiseFeedForward"]  # (a layer's parts)
    + ["torch.nn.Transformer", "torch.nn.TransformerEncoderLayer", "torch.nn.TransformerDecoderLayer"],
)
def _parameter_count_checks():
    rng = _rng("parameter_count")  # a vocabulary, and one configuration in each check, drawn anew for each grading
    V, drawn_h_d_k = rng.randint(1000, 40000), (rng.choice([2, 4, 8]), rng.choice([8, 16, 24, 40]))
    drawn_sizes = (rng.randint(1, 5), rng.choice([64, 96, 192, 320]), rng.choice([128, 256, 768]))  # (d_model: 8 heads)

    def configs(**changes):
        from aiayn.model import TransformerConfig

        return TransformerConfig(**{"vocab_size": V, **changes})

    def count(call, f, c, what):
        got, want = call(f, c), _parameter_count(c)
        if got != want:
            causes = [
                (_parameter_count(c, biases=False), "the biases of the projections are missing"),
                (_parameter_count(c, norms=False), "the LayerNorms (a gain and a bias each) are missing"),
                (
                    _parameter_count(c, tied=False),
                    "the three embeddings are counted separately; here they are one tied matrix",
                ),
            ]
            cause = next((f": {why}" for wrong, why in causes if got == wrong), "")
            raise Failed(f"{what}: {_relative(float(got), float(want))}{cause}")

    def base(f, call):
        count(call, f, configs(), f"the base model, vocabulary {V}")

    def d_k(f, call):
        for h, dk in [(1, 512), (4, 128), (16, 32), (32, 16), (8, 16), drawn_h_d_k]:
            count(call, f, configs(h=h, d_k=dk), f"h = {h}, d_k = {dk} (rows A and B)")

    def sizes(f, call):
        for N, d_model, d_ff in [(2, 512, 2048), (6, 256, 1024), (6, 1024, 4096), (4, 128, 512), drawn_sizes]:
            count(call, f, configs(N=N, d_model=d_model, d_ff=d_ff), f"N = {N}, d_model = {d_model}, d_ff = {d_ff}")

    return [
        ("base", "the base model", 1, base),
        ("d_k", "h and d_k varied, as in rows (A) and (B)", 1, d_k),
        ("sizes", "N, d_model and d_ff varied, as in rows (C)", 1, sizes),
    ]
