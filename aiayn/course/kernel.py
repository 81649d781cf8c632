"""The student's side of a graded call: the one module of the course that a submission's kernel can import.

A check (``aiayn/course/checks.py``) never runs where the student's code runs. Under the grader, each call of the
student's function travels as a request: the grader sends the inputs, this module calls the student's function in
the sandboxed kernel and sends back the result as data (tensors, numbers, strings, lists, tuples, dicts), with the
exception it raised, whether it called the book's implementation, and how long it took. The comparison with the
references and the points stay in the grader's process. In a student's own run the check calls ``run`` directly.

Nothing here, or in the checks' inputs (``inputs``, the one other module a kernel can import), knows a right answer.

Not about the paper: the exercises live in the chapters (book/) and course/.
"""

import base64
import contextlib
import ctypes
import decimal
import fractions
import functools
import hashlib
import importlib
import inspect
import io
import os
import pkgutil
import signal
import struct
import sys
import threading
import time
import types

import torch

MAX_ELEMENTS = 4_000_000  # tensor elements a result may hold (and items at all levels, as the grader counts them)
MAX_OUTPUT = 8_000_000  # characters a kernel may print under the grader (it keeps 4,000,000 of a notebook)
DIGEST = "aiayn-answer-sha256"  # what precedes the digest of an answer that serve prints
# threads: the student's that ran beside a call (one started before it, which the call watch does not see)
# chapter: the functions of the chapter's cells (not the exercise's references) that the call ran, for the report
NO_ANSWER = dict(value=None, error=None, missing=False, timeout=False, calls=[], seconds=0.0, threads=0, chapter=[])
THREADS = None  # under the grader: the kernel's own threads as it started
LIBRARY_THREADS = (("zmq.utils.garbage", "gc", "thread"),)  # which the book's cells start (tqdm's monitor: off)
SYSCALLS = {"x86_64": (0xC000003E, 317, (57, 58, 59, 322, 319), 56), "aarch64": (0xC00000B7, 277, (221, 281, 279), 220)}
# what the call watch records when the student's code put a profiler of its own in place of the watch's
BUILTIN = type(sys.intern)  # sys's own functions (a stand-in for one is not)
CONSTANTS = (str, bytes, int, float, complex, bool, type(None), type(Ellipsis))  # what Python compiles to constants
CHAPTER = "the chapter's "  # a call of a function of the chapter's cells that is not a reference: flagged
WATCH_OFF = "replaced the grader's call watch with a profiler of its own (sys.setprofile, cProfile, ...)"


class _Timeout(BaseException): ...  # not an Exception: a student's `except Exception` does not swallow it


def serve(request: str) -> None:
    """Under the grader: one call of the student's function (in the namespace of the cell that calls this, read from
    its frame: no name a submission can bind is looked up), from a request the grader sent, answered as data in the
    file the request names (not as output, which a submission can flood), and the file's SHA-256 printed: the grader
    takes the answer only if the cell printed one digest, that of the file (code that runs after the call, a hook or a
    thread, cannot write an answer of its own in its place)."""
    req = torch.load(io.BytesIO(base64.b64decode(request)), weights_only=False)  # the grader's own inputs
    torch.save(run(req, sys._getframe(1).f_globals), buffer := io.BytesIO())
    with open(req["answer"], "wb") as file:
        file.write(buffer.getvalue())
    # past the cap on what the kernel prints (its class's own write, not the capped one load_ipython_extension set)
    type(sys.stdout).write(sys.stdout, f"\n{DIGEST} {hashlib.sha256(buffer.getvalue()).hexdigest()}\n")
    sys.stdout.flush()


def load_ipython_extension(shell) -> None:
    """Under the grader, as the kernel starts (``--IPKernelApp.extensions=aiayn.course.kernel``): what its cells print
    past ``MAX_OUTPUT`` characters in all is dropped here, and IPython keeps no copy of what they print. Otherwise
    IPython's history of outputs holds all of it, and a cell that prints without end fills the kernel's memory and
    kills it before the cell's time limit can stop it."""

    class Forget(dict):  # IPython's record of each cell's output, which keeps nothing
        __contains__, __getitem__ = (lambda self, key: False), (lambda self, key: [])

    global THREADS
    shell.history_manager.outputs, left, THREADS = Forget(), [MAX_OUTPUT], frozenset(sys._current_frames())
    importlib.import_module("tqdm").tqdm.monitor_interval = 0  # no monitor thread, whose refresh() a subclass runs
    _no_processes()

    def capped(write):
        def write_within(text):
            text, left[0] = text[: max(left[0], 0)], left[0] - len(text)
            return write(text) if text else 0

        return write_within

    sys.stdout.write, sys.stderr.write = capped(sys.stdout.write), capped(sys.stderr.write)


def _no_processes() -> None:
    """Under the grader: no thread of the kernel can start a process or run a program (a seccomp filter, which nothing
    in the kernel can lift): a child Python would run the book's code where the call watch does not see it. Nor can it
    make a memory file (memfd_create): memory held there is counted by no limit of the kernel's."""
    arch, nr, refused, clone = SYSCALLS[os.uname().machine]
    # (code, jump if true, if false, k; 0x50001 is the error EPERM): a foreign architecture's call, or x32's, is
    # refused; clone3 answers ENOSYS, so that a thread is made with clone; fork, vfork and exec are refused; clone is
    # let run only with CLONE_THREAD in its flags
    prog = [(0x20, 0, 0, 4), (0x15, 1, 0, arch), (6, 0, 0, 0x50001), (0x20, 0, 0, 0), (0x45, 0, 1, 1 << 30)]
    prog += [(6, 0, 0, 0x50001), (0x15, 0, 1, 435), (6, 0, 0, 0x50026), *[(0x15, 0, 1, n) for n in refused]]
    prog[8:] = [x for jump in prog[8:] for x in (jump, (6, 0, 0, 0x50001))]
    prog += [(0x15, 0, 3, clone), (0x20, 0, 0, 16), (0x45, 1, 0, 0x10000), (6, 0, 0, 0x50001), (6, 0, 0, 0x7FFF0000)]
    code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *op) for op in prog))
    fprog = ctypes.c_char_p(struct.pack("HxxxxxxP", len(prog), ctypes.addressof(code)))  # (length, program)
    # no_new_privs (bubblewrap has set it), then the filter in every thread (TSYNC)
    if (libc := ctypes.CDLL(None)).prctl(38, 1, 0, 0, 0) or libc.syscall(nr, 1, 1, fprog) != 0:
        os._exit(70)  # a kernel that could start processes is not graded
    sys.addaudithook(_audit)  # (an audit hook stays for the process's life)


def _audit(event: str, args, _frame=sys._getframe, _profile=sys.getprofile, _file=__file__, _fn=types.FunctionType):
    """Nor a subinterpreter, which runs in the same thread where the call watch's profiler does not see it; nor a change
    of the profiler while it watches a call, by any route (the event comes from C), but by the watch that set it, nor a
    change to its function's code. (Its helpers are bound as the kernel starts, before any code of the submission.)"""
    if event == "cpython.PyInterpreterState_New":
        raise PermissionError("a subinterpreter cannot start under the grader")
    if event not in ("sys.setprofile", "sys.settrace", "object.__setattr__") or type(watch := _profile()) is not _fn:
        return
    if (watch.__code__.co_filename, watch.__code__.co_name) == (_file, "profile"):  # a call watch's
        caller = _frame(1)  # (the watch's own __call__ ends the watch it set)
        own = caller.f_code.co_filename == _file and caller.f_locals.get("profile") is watch
        # (a trace function's calls are not profiled: CPython runs it with tracing, and profiling, off)
        refused = event == "sys.settrace" or event == "sys.setprofile" and not own
        if refused or event == "object.__setattr__" and args[0] is watch:
            raise PermissionError("the grader's call watch cannot be switched off while it watches a call")


def run(req: dict, namespace: dict) -> dict:
    """Call the student's function named in ``req`` (found in ``namespace``) with its inputs: the answer as data."""
    answer = dict(NO_ANSWER, calls=[])
    f = next((namespace[n] for n in req["names"] if callable(namespace.get(n))), None)
    if f is None:
        return {**answer, "missing": True}
    args, kwargs, init = req["args"], req["kwargs"], req.get("init")
    if req.get("grad") is not None:
        args[req["grad"]].requires_grad_(True)
    if any(isinstance(a, torch.optim.Optimizer) for a in args):
        importlib.import_module("torch._dynamo")  # an optimizer's first step imports it: not the student's time
    watch = Watch(req["references"], namespace, known=req.get("watched"))
    own = getattr(sys.modules.get("aiayn.course.kernel"), "THREADS", None)  # (the module the kernel started with)
    # the libraries' own threads (module, object, its thread): pyzmq's collector of large outputs sent
    theirs = {getattr(getattr(sys.modules.get(m), a, None), b, None) for m, a, b in LIBRARY_THREADS} - {None}
    others = lambda: {i for i in sys._current_frames() if threading._active.get(i) not in theirs}  # noqa: E731
    mine, beside = others() - {threading.get_ident()}, set()
    if own:  # under the grader: no trace function of the student's (set before the call, it would run unwatched)
        sys.settrace(None), threading.settrace(None)
    start = time.perf_counter()
    try:
        made = init is not None and (isinstance(f, type) or req.get("made"))  # made with `init`, then called
        call = (lambda: f(*init)(*args, **kwargs)) if made else (lambda: f(*args, *(init or ()), **kwargs))
        if req.get("grad") is not None:  # the backward pass inside the watch too: it runs the tensors' hooks
            call = (lambda forward: lambda: ((v := forward()), torch.autograd.grad(v, args[req["grad"]])[0]))(call)
        # read as data inside the watch, with the threads beside it then: what would change the answer after the call
        # (a thread that it started and that goes on, a finaliser) runs watched, or too late
        read = lambda: (to_data((call(), list(args)) if req.get("observe") else call()), others())  # noqa: E731
        answer["value"], beside = watch(read, _seconds=req["seconds"])
    except (_Timeout, KeyboardInterrupt) as err:  # its own time limit, the grader's interrupt, or the student's own
        late = isinstance(err, _Timeout) or time.perf_counter() - start >= req["seconds"]
        answer["timeout" if late else "error"] = True if late else ("KeyboardInterrupt", "raised by your code")
    except BaseException as err:  # the student's code raising (or exiting)
        answer["error"] = (type(err).__name__, (str(err).strip().splitlines() or [""])[0][:400])
    answer["calls"] = [hit for hit in watch.hits if not hit.startswith(CHAPTER)]
    answer["chapter"], answer["seconds"] = [h for h in watch.hits if h.startswith(CHAPTER)], time.perf_counter() - start
    # the student's threads that ran beside the call: started before it, or by it and still running as it returned
    answer["threads"] = len((mine | beside) - own - {threading.get_ident()}) if own else 0
    return answer


def to_data(x, depth: int = 0):
    """What a result may be, as plain data: tensors (not subclasses), numbers (a fraction or a decimal as a float),
    strings, None, and lists, tuples and dicts of them. The checks' recording inputs (``inputs``) give their
    observations."""
    if depth > 20:
        raise TypeError("your function returned data nested more than 20 levels deep")
    if type(x) is getattr(sys.modules.get("aiayn.course.inputs"), type(x).__name__, None):  # (the checks' own class)
        return to_data(x.__data__(), depth + 1)
    if type(x) in (torch.Tensor, torch.nn.Parameter):
        if x.numel() > MAX_ELEMENTS:
            raise TypeError(f"your function returned a tensor of {x.numel():,} elements")
        return x.detach().cpu().clone().as_subclass(torch.Tensor)
    if isinstance(x, torch.Tensor):
        raise TypeError(f"return a torch.Tensor, not a {type(x).__name__}: a subclass can change how it compares")
    if x is None or type(x) in (bool, int, float, str):
        return x
    if type(x) in (fractions.Fraction, decimal.Decimal):  # exact numbers, read by the library's own float()
        return float(x)
    if type(x) in (list, tuple):
        return type(x)(to_data(v, depth + 1) for v in x)
    if type(x) is dict and all(type(k) is str for k in x):
        return {k: to_data(v, depth + 1) for k, v in x.items()}
    np = sys.modules.get("numpy")  # numpy's own arrays and scalars of numbers only (a look-alike's item() runs later)
    if np and (type(x) is np.ndarray or type(x) in np.sctypeDict.values()) and x.dtype.kind in "biuf":
        return x.item() if x.ndim == 0 else to_data(torch.from_numpy(x.copy()), depth + 1)
    raise TypeError(
        f"your function returned a {type(x).__name__}, which the checks cannot read: return tensors, numbers, "
        "strings, or lists, tuples and dicts of them"
    )


# ----------------------------------------------------------------------------------------------------------
# The call watch: did the student's function call the book's implementation of what it was asked to write?
# ----------------------------------------------------------------------------------------------------------


def reference_source(path: str) -> tuple[str, object]:
    """(qualified name, object) of a dotted reference path such as ``aiayn.positional.PositionalEncoding.__init__``:
    the name past its module ("PositionalEncoding.__init__"), as a notebook that defines it holds it."""
    obj = pkgutil.resolve_name(path)
    return path.removeprefix(f"{getattr(obj, '__module__', None)}."), getattr(obj, "__func__", obj)


def _codes(obj) -> list:
    """The code objects a call of ``obj`` runs first: a function's (past a decorator such as ``torch.no_grad()``,
    whose wrapper's code every function it decorates shares), or every method of a class."""
    obj = getattr(obj, "__wrapped__", getattr(obj, "__func__", obj))
    if isinstance(obj, type):
        return [c for v in vars(obj).values() for c in _codes(v)]
    return [obj.__code__] if isinstance(getattr(obj, "__code__", None), types.CodeType) else []


def _key(code) -> tuple:
    """What a piece of compiled code does, apart from where it was written: its bytecode, names and constants, and
    those of the code it holds (a student's helper of the chapter's name and shape has other names or constants); the
    same in every process."""
    return code.co_code, code.co_names, code.co_varnames, code.co_freevars, tuple(map(_constant, code.co_consts))


def _constant(c):
    """A constant of compiled code, as data: Python's own constants only (a copy of compiled code can hold any object,
    whose repr would run the student's code inside the call watch's profiler, unwatched)."""
    if type(c) is frozenset:  # its items sorted: their order follows the process's hash seed
        return "frozenset", tuple(sorted(map(repr, map(_constant, c))))
    if type(c) is tuple:
        return "tuple", tuple(map(_constant, c))
    if type(c) is types.CodeType:
        return _key(c)
    return (type(c).__name__, repr(c)) if type(c) in CONSTANTS else ("an object",)


def _compiled(code) -> list:
    """Every code object of compiled code: its own and those it holds, at any depth."""
    return [code] + [c for held in code.co_consts if isinstance(held, types.CodeType) for c in _compiled(held)]


def watched(references: list[str], namespace: dict | None = None, defined: dict | None = None, chapter=()) -> tuple:
    """What a call of each reference runs: ({``_key`` of its code: path}, {aten operator: path} for one written in C).
    Its code: the book's or a library's, and the chapter's own definition of that name. ``defined``: under the grader,
    the source of the book's cell that defines each name, compiled in the grader's process (the kernel's modules and
    names are the student's to replace), and ``chapter``: other names it defines, each "the chapter's NAME" (a helper
    that computes what the exercise asks for). In a student's own run, where the notebook's cells are not told apart,
    the ``namespace``'s object of that name is taken as the chapter's."""
    keys, operators = {}, {}
    for name in chapter:
        keys |= {_key(c): f"{CHAPTER}{name}" for c in _defined_as(name, defined[name])}
    for path in references:
        qualname, obj = reference_source(path)
        first, *rest = qualname.split(".")
        if defined is None:  # the namespace's object of that name
            mine = _codes(functools.reduce(lambda obj, part: getattr(obj, part, None), rest, namespace.get(first)))
        else:
            mine = _defined_as(qualname, defined.get(first, ""))
        found = _codes(obj) + mine
        keys |= {_key(c): path for c in found}
        if not found:  # a C function: the aten operator it runs
            operators[getattr(obj, "__name__", qualname.split(".")[-1]).strip("_")] = path
    return keys, operators


def _defined_as(qualname: str, source: str) -> list:
    """The code of the functions of that name (or its class's methods) that a book's cell compiles to."""
    cell = _compiled(compile(source, "<book>", "exec"))
    mine = [c for c in cell if c.co_flags & inspect.CO_NEWLOCALS and "<locals>" not in c.co_qualname]
    return [c for c in mine if c.co_qualname == qualname or c.co_qualname.startswith(f"{qualname}.")]


class Watch:
    """``watch(f, *args)`` runs the student's ``f`` with a time limit and records each call of a reference, in every
    thread the call starts: the book's function or class, or the chapter's own definition of it earlier in the
    notebook, by its code: the same object, or code that does the same (its compiled code renamed); a reference written
    in C (torch's fused kernels) by the operator it runs, whatever the route (``torch.ops.aten``, a thread). A pasted
    copy of the source is not a call: the grader flags it from the submission's source (``grader.near_copies``)."""

    def __init__(self, references: list[str], namespace: dict, defined: dict | None = None, known=None):
        """``known``: ``watched(references, defined=...)`` as the grader found it; else found here."""
        self.keys, self.operators = known or watched(references, namespace, defined)
        self.seen, self.hits = {}, []

    def _operator(self, event) -> str | None:
        op, sdpa = event.name.removeprefix("aten::").strip("_"), "scaled_dot_product"  # any of its fused kernels
        found = [p for ref, p in self.operators.items() if op == ref or (op.startswith(sdpa) and ref.startswith(sdpa))]
        if op == "cross_entropy_loss":  # PyTorch's label smoothing: a reference only when it smooths (argument 5)
            found = [f"{p} with label_smoothing={s:g}" for p in found for s in event.concrete_inputs[5:] if s]
        return found[0] if found else None

    def __call__(self, f, *args, _seconds: float = 0, **kwargs):
        def profile(frame, event, arg):
            if event != "call":
                return
            # each code object read once (and held: its id is no other's), by what it does: the reference's own, or a
            # copy of it under another name (code.replace(co_name=...)), which does the same
            if (known := self.seen.get(id(frame.f_code))) is None:
                code = frame.f_code
                known = self.seen[id(code)] = (code, self.keys.get(_key(code)))
            if known[1] and known[1] not in self.hits:
                self.hits.append(known[1])

        timer, recorded = _seconds > 0 and threading.current_thread() is threading.main_thread(), None
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
                    # not watched: a profiler of the student's in place, or sys's own functions replaced by stand-ins
                    real = all(type(g) is BUILTIN and g.__self__ is sys for g in (sys.setprofile, sys.getprofile))
                    if not real or sys.getprofile() is not profile or threading.getprofile() is not profile:
                        self.hits.append(WATCH_OFF)
                    sys.setprofile(previous)
                    threading.setprofile(None)
                    if timer:
                        signal.setitimer(signal.ITIMER_REAL, 0)
                        signal.signal(signal.SIGALRM, previous_handler)
        finally:
            if recorded is not None:  # read once the profiler has stopped
                self.hits += list(dict.fromkeys(p for p in map(self._operator, recorded.function_events) if p))
        return value


def _alarm(signum, frame):
    raise _Timeout()


@contextlib.contextmanager
def _operators():
    """A profiler of torch's operators in every thread (its log lines, written to the process's stderr, dropped): the
    autograd profiler that torch.profiler wraps, whose first start does not import torch's compiler (2 s a kernel)."""
    config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        with torch.autograd.profiler.profile(record_shapes=True, experimental_config=config) as recorder:
            os.dup2(saved, 2)
            yield recorder
            os.dup2(null, 2)
    finally:
        os.dup2(saved, 2)
        os.close(saved), os.close(null)
