"""The student's side of a graded call: the one module of the course that a submission's kernel can import.

A check (``aiayn/course/checks.py``) never runs where the student's code runs. Under the grader, each call of the
student's function travels as a request: the grader sends the inputs, this module calls the student's function in
the sandboxed kernel and sends back the result as data (tensors, numbers, strings, lists, tuples, dicts), with the
exception it raised, whether it called the book's implementation, and how long it took. The comparison with the
references and the points stay in the grader's process. In a student's own run the check calls ``run`` directly.

Nothing here knows a right answer: the inputs' classes below (a stand-in model, an optimizer and a scheduler that
record what they saw) hold no reference implementation.

Not about the paper: the exercises live in the chapters (book/) and course/.
"""

import ast
import base64
import contextlib
import copy
import dis
import importlib.util
import inspect
import io
import os
import signal
import sys
import textwrap
import threading
import time
import types

MIME = "application/vnd.aiayn.call+json"  # the result of one call, as the kernel displays it to the grader
MAX_ELEMENTS = 4_000_000  # tensor elements a result may hold


class _Timeout(BaseException):  # not an Exception: a student's `except Exception` does not swallow it
    pass


def serve(request: str, namespace: dict) -> None:
    """Under the grader: one call of the student's function, from a request the grader sent, answered as data."""
    import torch
    from IPython.display import display

    req = torch.load(io.BytesIO(base64.b64decode(request)), weights_only=False)  # the grader's own inputs
    answer = run(req, namespace)
    buffer = io.BytesIO()
    try:
        torch.save(answer, buffer)
    except Exception as err:
        buffer = io.BytesIO()
        torch.save({**answer, "value": None, "error": ("TypeError", str(err)[:300])}, buffer)
    display({MIME: {"nonce": req["nonce"], "data": base64.b64encode(buffer.getvalue()).decode()}}, raw=True)


def run(req: dict, namespace: dict) -> dict:
    """Call the student's function named in ``req`` (found in ``namespace``) with its inputs: the answer as data."""
    import torch

    answer = {"value": None, "error": None, "missing": False, "timeout": False, "calls": [], "seconds": 0.0}
    f = next((namespace[n] for n in req["names"] if callable(namespace.get(n))), None)
    if f is None:
        return {**answer, "missing": True}
    args, kwargs, init = req["args"], req["kwargs"], req.get("init")
    if req.get("grad") is not None:
        args[req["grad"]].requires_grad_(True)
    if any(isinstance(a, torch.optim.Optimizer) for a in args):
        import torch._dynamo  # noqa: F401  (an optimizer's first step imports it: not the student's time)
    watch = Watch(req["references"], namespace)
    start = time.perf_counter()
    try:
        if init is not None and isinstance(f, type):  # a class: made with `init`, then called with the inputs
            value = watch(lambda: f(*init)(*args, **kwargs), _seconds=req["seconds"])
        else:
            value = watch(f, *args, *(init or ()), _seconds=req["seconds"], **kwargs)
        if req.get("grad") is not None:
            value = (value, torch.autograd.grad(value, args[req["grad"]])[0])
        if req.get("observe"):
            value = (value, list(args))
        answer["value"] = to_data(value)
    except (_Timeout, KeyboardInterrupt):  # its own time limit, or the grader's interrupt
        answer["timeout"] = True
    except BaseException as err:  # the student's code raising (or exiting)
        lines = str(err).strip().splitlines()
        answer["error"] = (type(err).__name__, lines[0][:400] if lines else "")
    answer["calls"], answer["seconds"] = watch.hits, time.perf_counter() - start
    return answer


def to_data(x, depth: int = 0):
    """What a result may be, as plain data: tensors (not subclasses), numbers, strings, None, and lists, tuples and
    dicts of them. The inputs' recording classes give their observations."""
    import torch

    if depth > 20:
        raise TypeError("your function returned data nested more than 20 levels deep")
    if hasattr(type(x), "__data__") and type(x).__module__ == __name__:
        return to_data(x.__data__(), depth + 1)
    if type(x) in (torch.Tensor, torch.nn.Parameter):
        if x.numel() > MAX_ELEMENTS:
            raise TypeError(f"your function returned a tensor of {x.numel():,} elements")
        return x.detach().cpu().clone().as_subclass(torch.Tensor)
    if isinstance(x, torch.Tensor):
        raise TypeError(f"return a torch.Tensor, not a {type(x).__name__}: a subclass can change how it compares")
    if x is None or type(x) in (bool, int, float, str):
        return x
    if type(x) in (list, tuple):
        return type(x)(to_data(v, depth + 1) for v in x)
    if type(x) is dict and all(type(k) is str for k in x):
        return {k: to_data(v, depth + 1) for k, v in x.items()}
    if type(x).__module__ == "numpy" and hasattr(x, "item") and getattr(x, "ndim", 1) == 0:
        return x.item()
    raise TypeError(
        f"your function returned a {type(x).__name__}, which the checks cannot read: return tensors, numbers, "
        "strings, or lists, tuples and dicts of them"
    )


# ----------------------------------------------------------------------------------------------------------
# The call watch: did the student's function call the book's implementation of what it was asked to write?
# ----------------------------------------------------------------------------------------------------------

_SKIP = {"RESUME", "NOP", "CACHE", "EXTENDED_ARG", "PRECALL", "COPY_FREE_VARS", "MAKE_CELL"}
_MIN_COPY = 24  # shorter references are matched by identity only: an answer written from scratch may compile alike
_MIN_TREE = 60  # likewise, in syntax-tree nodes
_SOURCES: dict = {}  # module path -> (source, code objects), read once per kernel


def _fingerprint(code: types.CodeType) -> tuple:
    """The instructions of a code object, without line numbers, docstring or the names of local variables: a copy
    of a function, pasted or exec'd from its source with its variables renamed, has the same fingerprint."""
    local: dict[str, int] = {}
    out = []
    for ins in dis.get_instructions(code):
        if ins.opname in _SKIP:
            continue
        arg = ins.argval
        if isinstance(arg, types.CodeType):
            arg = _fingerprint(arg)
        elif "FAST" in ins.opname or "DEREF" in ins.opname or ins.opname == "LOAD_CLOSURE":
            arg = tuple(local.setdefault(n, len(local)) for n in (arg if isinstance(arg, tuple) else (arg,)))
        elif isinstance(arg, frozenset):
            arg = tuple(sorted(map(repr, arg)))
        else:
            arg = repr(arg)
        out.append(("LOAD_ATTR" if ins.opname == "LOAD_METHOD" else ins.opname, arg))
    return tuple(out)


def _code_objects(code: types.CodeType, prefix: str = "") -> dict:
    """qualified name -> code object, for every function and method compiled from a module's source."""
    found = {}
    for const in code.co_consts:
        if isinstance(const, types.CodeType) and not const.co_name.startswith("<"):
            found[prefix + const.co_name] = const
            found.update(_code_objects(const, prefix + const.co_name + "."))
    return found


def tree(source: str, qualname: str | None = None):
    """The definition of ``qualname`` (or the first function or class) in ``source``, as an ast node, or None."""
    try:
        node = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return None
    for part in qualname.split(".") if qualname else [None]:
        node = next(
            (n for n in node.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and part in (None, n.name)), None
        )
        if node is None:
            return None
    return node


def normalised(node) -> str:
    """A function's syntax tree without its name, docstring, annotations and comments, its arguments and local names
    numbered in order: a pasted copy under another name or with renamed variables has the same text."""
    node = copy.deepcopy(node)
    node.name, node.decorator_list = "f", []
    if isinstance(node, ast.FunctionDef):
        node.returns = None
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        node.body = body[1:] or [ast.Pass()]
    names: dict[str, str] = {}
    for n in ast.walk(node):
        if isinstance(n, ast.arg):
            n.annotation, n.arg = None, names.setdefault(n.arg, f"v{len(names)}")
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            names.setdefault(n.id, f"v{len(names)}")
        elif isinstance(n, ast.AnnAssign):
            n.annotation = ast.Constant(None)
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id in names:
            n.id = names[n.id]
    return ast.dump(node, annotate_fields=False)


def reference_source(path: str) -> tuple[str, str, object]:
    """(module, qualified name, object) of a dotted reference path such as ``aiayn.attention.attention``."""
    for i in range(1, path.count(".") + 1):  # the longest module path first
        module, qualname = path.rsplit(".", i)[0], ".".join(path.split(".")[-i:])
        try:
            if importlib.util.find_spec(module) is None:
                continue
        except (ImportError, ValueError):
            continue
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part, None)
        return module, qualname, getattr(obj, "__func__", obj)
    raise ValueError(f"reference {path} not found")


class Watch:
    """``watch(f, *args)`` runs the student's ``f`` with a time limit and records each call of a reference: the
    book's function, the chapter's own definition of it in the notebook, or a copy of it; in every thread the call
    starts. A reference written in C (torch's fused kernels) is recorded by the operator it runs, whatever the route
    (``torch.ops.aten``, a thread)."""

    def __init__(self, references: list[str], namespace: dict):
        self.codes, self.objects, self.sources, self.operators, self.hits = {}, {}, {}, {}, []
        for path in references:
            module, qualname, obj = reference_source(path)
            spec = importlib.util.find_spec(module)
            if module.startswith("aiayn.") and spec.origin and spec.origin.endswith(".py"):
                if spec.origin not in _SOURCES:  # the code as the file has it, whatever was patched since
                    text = open(spec.origin, encoding="utf-8").read()
                    _SOURCES[spec.origin] = (text, _code_objects(compile(text, spec.origin, "exec")))
                text, codes = _SOURCES[spec.origin]
                self._code(codes[qualname], path, [obj, _lookup(namespace, qualname)])
                self._source(tree(text, qualname), path)
            elif isinstance(obj, types.FunctionType):
                self._code(obj.__code__, path, [obj])
                try:
                    self._source(tree(inspect.getsource(obj)), path)
                except (OSError, TypeError):
                    pass
            else:  # a C function: the aten operator it runs
                name = getattr(obj, "__name__", qualname.split(".")[-1]).strip("_")
                self.operators[name] = path

    def _code(self, code, path: str, live: list) -> None:
        fp = _fingerprint(code)
        if len(fp) >= _MIN_COPY:
            self.codes[fp] = path
        for o in live:
            c = getattr(getattr(o, "__func__", o), "__code__", None)
            if isinstance(c, types.CodeType) and _fingerprint(c) == fp:
                self.objects[id(c)] = (path, c)

    def _source(self, node, path: str) -> None:
        if node is not None and sum(1 for _ in ast.walk(node)) >= _MIN_TREE:
            self.sources[normalised(node)] = path

    def _match(self, code: types.CodeType, seen: dict) -> str | None:
        if id(code) not in seen:  # installed libraries' code (torch's own imports, say) by identity only: quick
            hit = self.objects.get(id(code), (None,))[0]
            if not hit and not code.co_filename.startswith((sys.prefix, sys.base_prefix, "<frozen")):
                hit = self.codes.get(_fingerprint(code))
                try:
                    node = None if hit or not self.sources else tree("".join(inspect.getsourcelines(code)[0]))
                    hit = hit or (self.sources.get(normalised(node)) if node is not None else None)
                except (OSError, TypeError, IndexError):
                    pass
            seen[id(code)] = (code, hit)
        return seen[id(code)][1]

    def _operator(self, name: str) -> str | None:
        op = name.removeprefix("aten::").strip("_")
        for ref, path in self.operators.items():
            if op == ref or (ref.startswith("scaled_dot_product") and op.startswith("scaled_dot_product")):
                return path
        return None

    def __call__(self, f, *args, _seconds: float = 0, **kwargs):
        seen: dict = {}

        def profile(frame, event, arg):
            if event == "call":
                name = self._match(frame.f_code, seen)
                if name:
                    self.hits.append(name)

        timer = _seconds > 0 and threading.current_thread() is threading.main_thread()
        recorded = None
        try:
            with _operators() if self.operators else contextlib.nullcontext() as recorded:
                if timer:  # started once the profiler runs: its start is not the student's time
                    previous_handler = signal.signal(signal.SIGALRM, _alarm)
                    signal.setitimer(signal.ITIMER_REAL, _seconds)
                previous = sys.getprofile()
                sys.setprofile(profile)
                threading.setprofile(profile)
                try:
                    value = f(*args, **kwargs)
                finally:
                    sys.setprofile(previous)
                    threading.setprofile(None)
                    if timer:
                        signal.setitimer(signal.ITIMER_REAL, 0)
                        signal.signal(signal.SIGALRM, previous_handler)
        finally:
            if recorded is not None:  # read once the profiler has stopped
                self.hits += [p for p in map(self._operator, {e.name for e in recorded.events()}) if p]
        return value


def _alarm(signum, frame):
    raise _Timeout()


def _lookup(namespace: dict, qualname: str):
    obj = namespace
    for part in qualname.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else getattr(obj, part, None)
    return obj


@contextlib.contextmanager
def _operators():
    """A profiler of torch's operators in every thread (its log lines, written to the process's stderr, dropped)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        with profile(activities=[ProfilerActivity.CPU], experimental_config=config) as recorder:
            os.dup2(saved, 2)
            yield recorder
            os.dup2(null, 2)
    finally:
        os.dup2(saved, 2)
        os.close(saved), os.close(null)


# ----------------------------------------------------------------------------------------------------------
# Inputs that record what the student's code did with them
# ----------------------------------------------------------------------------------------------------------

BOS, EOS, PAD = 1, 2, 0


def _torch():
    import torch

    return torch


class TableModel(_torch().nn.Module):
    """A stand-in with the Transformer's interface: the logits of the next token depend only on the previous one,
    table[previous] = {token: logit}; other tokens get -5, whatever the source."""

    def __init__(self, table: dict, V: int = 10):
        super().__init__()
        torch = _torch()
        self.V = V
        self.config = types.SimpleNamespace(pad_id=PAD, vocab_size=V, max_len=64, N=1, d_model=V)
        self.generator = torch.nn.Identity()
        logits = torch.full((V, V), -5.0)
        for a, row in table.items():
            for b, value in row.items():
                logits[a, b] = value
        self.register_buffer("logits", logits)

    def encode(self, src):
        return _torch().zeros(src.size(0), src.size(1), self.V), (src != PAD)[:, None, None, :]

    def decode(self, tgt, memory, src_mask, cache=None, start=0):
        return self.logits[tgt]  # (batch, T, V): the "hidden state" is the logits

    def new_cache(self):
        return [{}]

    def forward(self, src, tgt):
        return self.generator(self.decode(tgt, *self.encode(src)))


class Recording(_torch().optim.SGD):
    """SGD that records the learning rate and the gradients it saw at each update."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.seen = []

    def step(self, closure=None):
        self.seen.append((self.param_groups[0]["lr"], [p.grad.clone() for p in self.param_groups[0]["params"]]))
        return super().step(closure)

    def __getstate__(self):  # an optimizer pickles only its own state
        return {**super().__getstate__(), "seen": self.seen}

    def __data__(self):
        return {"seen": self.seen}


class Noam:
    """Equation (3) with d_model 16, warmup 10 and a factor 100, as a LambdaLR factor of step s (from 0)."""

    def __call__(self, s):
        return 100.0 * 16**-0.5 * min((s + 1) ** -0.5, (s + 1) * 10**-1.5)


class Scheduler(_torch().optim.lr_scheduler.LambdaLR):
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
