"""nbgrader's plug-ins for the book's courses, named in the ``nbgrader_config.py`` that ``python -m aiayn.course
course`` writes:

- ``refuse_odd_submissions``: a submission holding a symbolic link, a hard link or a file that is not a regular file
  is not graded, and nothing of it is read;
- ``RestoreCells``: every cell of a submission gets its nbgrader metadata from the gradebook, never from the submission;
- ``Execute``: nbgrader's Execute with each kernel in a sandbox that holds as root (``SandboxKernelManager``), every
  check run in this process on the student's results as data, limits on output and time, and a statement that cannot
  be stopped skipped alone.

and, after ``nbgrader autograde``, ``report``: a line per submission with its points, and what an instructor should
read (``python -m aiayn.course report``).

Not about the paper: the exercises live in the chapters (book/) and course/, and their checks in checks.py.
"""

import ast
import asyncio
import atexit
import base64
import contextlib
import copy
import difflib
import hashlib
import io
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import zipfile
from pathlib import Path
from queue import Empty

import nbformat
import zmq.asyncio
from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import ensure_async, run_sync
from IPython.core.inputtransformer2 import TransformerManager
from IPython.core.magics import ExecutionMagics
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.preprocessors import Execute as NbGraderExecute, NbGraderPreprocessor
from traitlets import Bool, Float, Integer

from aiayn.course import kernel

QUIET = {"capture_output": True, "timeout": 60}  # a tool the grader runs: its output kept, its time bounded
FIRST_UID = 200_000  # a grader that is root runs each kernel as a user of its own (no account), numbered from here
MAX_MESSAGE = 8 << 20  # bytes: a larger message from a kernel is dropped before it reaches the grader's memory
MAX_PICKLE = 4 << 20  # bytes of a result's structure (its tensors apart): a dict of millions of keys is not read
RECEIVE_QUEUE = 8  # messages from a kernel that wait to be read, each under MAX_MESSAGE; the kernel drops the rest
LOST = f"its output did not reach the grader: a message over {MAX_MESSAGE >> 20} MiB, or over {RECEIVE_QUEUE} at once"
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/etc")  # what every sandbox sees, read-only
WORK = "/submission"  # where a kernel sees the copy of its submission's folder, its working folder
SPARE: list = []  # a kernel started for the next notebook to be graded (its folder goes when the grader ends)
atexit.register(lambda: subprocess.run(["rm", "-rf", "--", *[km.sandbox_dir for km in SPARE]], **QUIET))
MAX_FILE = 64 << 20  # bytes: a submission holding a larger file is not graded (as large as a kernel may write one)
DIGESTS = re.compile(rf"{kernel.DIGEST} [0-9a-f]{{64}}")  # the line kernel.serve prints after writing an answer

# ----------------------------------------------------------------------------------------------------------
# What a submission may hold
# ----------------------------------------------------------------------------------------------------------


def odd_files(folder: Path, within: Path | None = None) -> list[str]:
    """Why a submission folder cannot be graded without reading outside it, or within its limits: its symbolic links,
    hard links to a file outside ``within`` (the folder itself, or the course's submissions: which of two submissions
    that share a file made the link cannot be told), files that are not regular files (devices, pipes, sockets) and
    files over ``MAX_FILE`` bytes. Nothing is followed or opened."""
    folder, problems = Path(folder), []
    if folder.is_symlink() or folder.parent.is_symlink():
        return [f"{folder.name} is a symbolic link"]
    if len(found := _listing(folder)) > 10_000:
        return ["it holds over 10,000 files and folders"]
    inside = [e[4] for e in (_listing(within) if within else found) if e[0] == "f"]  # the inodes of within's files
    for kind, links, size, _, inode, name in found:
        if kind == "l":
            problems.append(f"{name} is a symbolic link")
        elif kind not in ("f", "d"):
            problems.append(f"{name} is not a regular file (a device, a pipe or a socket)")
        elif kind == "f" and links > 1 and links > inside.count(inode):
            problems.append(f"{name} is a hard link, to a file outside the submissions")
        elif size > MAX_FILE:
            problems.append(f"{name} is over {MAX_FILE >> 20} MiB, the most a file of a submission may hold")
        elif name.count("/") >= 64:  # past what copying it into the kernel's folder walks
            return problems + [f"{name.split('/')[0]}/... is nested more than 64 folders deep"]
    total = sum(size for kind, _, size, *_ in found if kind == "f")  # sparse files too: a copy writes them whole
    return problems or [f"its files hold over {MAX_FILE >> 20} MiB in all"] * (total > MAX_FILE)


def _listing(folder: Path) -> list[tuple[str, int, int, int, int, str]]:
    """(kind, links, bytes, bytes on disk, inode, path inside ``folder``) of everything in it, sorted by path: read by
    find, which follows no link, opens nothing, stays on one file system and walks a folder nested at any depth."""
    found = subprocess.run(["find", "-P", folder, "-xdev", "-printf", "%y %n %s %b %i %P\\0"], **QUIET).stdout
    entries = [os.fsdecode(entry).split(" ", 5) for entry in found.split(b"\0")[1:-1]]  # (the folder itself first)
    return sorted([(k, int(n), int(s), 512 * int(b), int(i), p) for k, n, s, b, i, p in entries], key=lambda e: e[5])


def refuse_odd_submissions() -> None:
    """Make ``nbgrader autograde`` check each submission with ``odd_files`` before it reads any of it: one with odd
    files fails alone (nbgrader logs the reason, grades the others and exits with status 1), and its student is in the
    gradebook, so that ``nbgrader export`` lists it with 0 points."""
    from nbgrader.converters import Autograde

    original = Autograde.init_assignment

    def init_assignment(self, assignment_id, student_id):
        if problems := odd_files(folder := Path(self._format_source(assignment_id, student_id)), folder.parents[1]):
            with Gradebook(self.coursedir.db_url, self.coursedir.course_id) as gb:  # in `nbgrader export`, with 0
                gb.update_or_create_student(student_id)
            raise ValueError(f"{student_id}/{assignment_id} not graded: {'; '.join(problems[:3])}")
        return original(self, assignment_id, student_id)

    Autograde.init_assignment = init_assignment


# ----------------------------------------------------------------------------------------------------------
# The cells of a submission: nbgrader metadata from the gradebook
# ----------------------------------------------------------------------------------------------------------


def restore(nb, source) -> list[str]:
    """Make a submission's nbgrader cells those of the instructor's copy (``source``, the gradebook's notebook) in
    place; return a line per kind of change. A cell whose grade id the instructor's copy lacks, or a second copy of one,
    becomes an ordinary cell; a known cell gets the instructor's metadata; a cell without metadata whose source is a
    read-only or graded cell's is recognised by its source; a graded cell missing from the submission is appended at
    the end, and a read-only one is named. nbgrader's OverwriteCells then restores the source of read-only and graded
    cells from the gradebook."""
    known = {c.name: c for c in source.source_cells}
    points, solutions = {c.name: c.max_score for c in source.grade_cells}, {c.name for c in source.solution_cells}
    by_source = {c.source.strip(): c.name for c in known.values() if c.locked and c.source.strip()}

    def metadata(name):
        meta = {"grade": name in points, "grade_id": name, "locked": known[name].locked, "schema_version": 3}
        return meta | {"solution": name in solutions} | ({"points": points[name]} if name in points else {})

    present, dropped, recognised, changed = {}, [], [], []
    for cell in nb.cells:
        cell.metadata.pop("aiayn", None)  # only the grader writes what the report reads
        name = cell.metadata.get("nbgrader", {}).get("grade_id")
        if name is not None and name in known and name not in present:
            present[name] = cell
            continue
        dropped += [repr(str(name)[:40])] if name is not None else []  # not the assignment's, or a second copy (quoted)
        cell.metadata.pop("nbgrader", None)
    for cell in nb.cells:
        name = by_source.get(cell.source.strip())
        if "nbgrader" not in cell.metadata and name is not None and name not in present:
            present[name], recognised = cell, recognised + [name]
    for name, cell in present.items():
        old = {k: v for k, v in cell.metadata.get("nbgrader", {}).items() if k not in ("checksum", "cell_type")}
        changed += [name] if old and old != metadata(name) else []
        cell.metadata["nbgrader"] = metadata(name)
    edited = [n for n, c in present.items() if known[n].locked and c.source.strip() != known[n].source.strip()]
    missing = [name for name in points if name not in present]
    absent = [name for name, c in known.items() if c.locked and name not in present and name not in points]
    for name in missing:  # (a copy of the instructor's cell)
        nb.cells.append(getattr(nbformat.v4, f"new_{known[name].cell_type}_cell")(known[name].source))
        nb.cells[-1].metadata["nbgrader"] = metadata(name)
    notes = [
        (dropped, "cell(s) marked as nbgrader cells the assignment lacks, or copies ({}): run as ordinary cells"),
        (changed, "cell(s) whose nbgrader metadata differ from the instructor's copy ({}): restored"),
        (edited, "read-only or graded cell(s) edited ({}): the instructor's source runs instead"),
        (missing, "graded cell(s) missing from the submission ({}): appended at the end"),
        (absent, "read-only cell(s) of the book missing from the submission ({}): not run"),
        (recognised, "cell(s) without nbgrader metadata recognised by their source ({})"),
    ]
    return [f"{len(names)} {text.format(', '.join(names))}" for names, text in notes if names]


class RestoreCells(NbGraderPreprocessor):
    """Before nbgrader's OverwriteCells: a submission's nbgrader cells become those of the instructor's copy
    (``restore``), and nbgrader's log and the graded notebook's metadata get a line for each kind of change."""

    def preprocess(self, nb, resources):
        info = resources["nbgrader"]
        with Gradebook(info["db_url"]) as gb:
            notes = restore(nb, gb.find_notebook(info["notebook"], info["assignment"]))
        for note in notes:
            self.log.warning("%s/%s: %s", info["student"], info["assignment"], note)
        nb.metadata["aiayn"] = {"notes": notes}  # for the report
        return nb, resources


# ----------------------------------------------------------------------------------------------------------
# What the report flags in the student's own cells: the book's code pasted, and code that reaches past its function
# ----------------------------------------------------------------------------------------------------------

SUSPECT_CALLS = {"eval", "exec", "compile", "__import__", "globals", "locals", "vars", "setattr", "delattr"}
SUSPECT_CALLS |= {"get_ipython", "breakpoint", "open", "make_fx"}  # (make_fx: torch.fx's trace, in other operators)
SUSPECT_MODULES = {"sys", "os", "inspect", "gc", "ctypes", "threading", "_thread", "multiprocessing", "concurrent"}
SUSPECT_MODULES |= {"subprocess", "signal", "importlib", "builtins", "marshal", "pickle", "dis", "types", "linecache"}
SUSPECT_MODULES |= {"traceback", "socket", "asyncio", "runpy", "code", "atexit", "faulthandler", "shutil", "IPython"}
SUSPECT_MODULES |= {"imp", "zipimport", "pathlib", "tempfile", "io", "fileinput", "glob", "shelve", "dbm"}  # files
SUSPECT_MODULES |= {"unittest", "logging", "queue", "sched", "posix", "nt", "mmap", "resource", "fcntl", "pty", "zmq"}
SUSPECT_MODULES |= {"cProfile", "profile", "_lsprof", "trace", "bdb", "pdb", "pytest", "_pytest"}  # hooks, patches
SUSPECT_ATTRIBUTES = {"f_back", "f_globals", "f_locals", "gi_frame", "tb_frame", "ops", "setprofile", "pythonapi"}
SUSPECT_ATTRIBUTES |= {"settrace", "overrides", "library", "_python_dispatch", "TorchFunctionMode", "TorchDispatchMode"}
SUSPECT_ATTRIBUTES |= {"fx", "export", "timeit", "benchmark", "run_in_executor"}  # torch.fx, Timer, another thread
PACKAGES = ("aiayn.course", "torch.fx", "torch.export", "functorch", "torch.utils.benchmark")  # flagged whole
PACKAGES += ("torch.utils.data.datapipes",)  # (FileLister: a folder listed)
SUSPECT_ATTRIBUTES |= {"jit", "load", "loads", "loadtxt", "fromfile", "from_file", "read_text", "read_bytes"}  # files
SUSPECT_ATTRIBUTES |= {"genfromtxt", "fromregex", "memmap", "dircmp", "read_csv", "read_json", "read_pickle"}
SUSPECT_ATTRIBUTES |= {"read_table", "read_fwf", "read_excel", "read_parquet", "read_feather", "smart_open"}
SMOOTHING = {"cross_entropy": 7, "CrossEntropyLoss": 5}  # the position of their label_smoothing argument
RESOLVING = {"eval", "query"}  # methods that resolve names from a string given to them (pandas', its DataFrame's)
PYTORCHS = {"scaled_dot_product_attention", "flex_attention", "multi_head_attention_forward", "MultiheadAttention"}
PYTORCHS |= {"TransformerEncoderLayer", "TransformerDecoderLayer", "TransformerEncoder", "TransformerDecoder"}
PYTORCHS |= {"lr_scheduler", "CosineAnnealingLR", "CosineAnnealingWarmRestarts", "OneCycleLR", "LinearLR", "LambdaLR"}
SUSPECT_ATTRIBUTES |= SUSPECT_CALLS - {"eval"} | SUSPECT_MODULES - {"code"}  # as another object's, or a module's
# strings run as code, threads (tornado's executor, started before a check, runs what the call watch never sees), and
# modules that set any object's attributes (argparse's parse_args(namespace=torch)); and resolvers:
REACH = {"pkgutil", "pydoc", "operator", "doctest", "codeop", "timeit", "ipykernel", "tornado", "argparse", "optparse"}
REACH |= {"yaml", "dill", "jsonpickle", "cloudpickle"}  # which build any object, a module's attribute set, from text
SUSPECT_MODULES |= REACH
RESOLVERS = {"import_item", "import_string", "import_module", "locate", "resolve_name", "attrgetter", "methodcaller"}
# string.Formatter's "0.__globals__", functools (wraps(ns)(torch) sets torch's attributes to ns's), typing
RESOLVERS |= {"get_field", "update_wrapper", "wraps", "get_type_hints", "ForwardRef"}
RESOLVERS |= {"singledispatch", "singledispatchmethod"}  # (which evaluate annotations: code in a string, typing's)
RESOLVERS |= {"Formatter"}  # string's, whose subclass's format_field gets the object "{0.attribute}" names
SUSPECT_ATTRIBUTES |= REACH | {"course", "reference_source", "profiler"}  # and the module that answers, its profiler
SUSPECT_ATTRIBUTES |= {"pub_thread", "io_loop", "add_callback"}  # the kernel's own threads, which run what they get
SUSPECT_CALLS, SUSPECT_ATTRIBUTES = SUSPECT_CALLS | RESOLVERS, SUSPECT_ATTRIBUTES | RESOLVERS
DOTTED = re.compile(r"[A-Za-z_]\w*(\.\w+)+")  # a string naming a module's attribute ("builtins.setattr")
AS_STRINGS = SUSPECT_MODULES - {"code", "io", "os", "types", "glob", "profile", "trace", "queue", "signal", "socket"}
SUSPECT_MODULES |= {"struct", "array", "base64", "binascii", "codecs", "zlib", "lzma", "bz2", "gzip"}  # data decoded
SUSPECT_ATTRIBUTES |= {"frombuffer", "fromhex", "from_bytes", "unhexlify", "b64decode", "decompress"}  # from bytes
# files written, and folders found and listed (an answer file rewritten after its call)
SUSPECT_ATTRIBUTES |= {"save", "savez", "savez_compressed", "savetxt", "tofile", "write_bytes", "write_text", "dump"}
SUSPECT_ATTRIBUTES |= {"to_pickle", "get_configdir", "get_cachedir", "get_data_path", "listdir", "scandir", "iterdir"}
READS = SUSPECT_ATTRIBUTES | RESOLVING  # what a getattr and an import may not name
OPTIONS = ExecutionMagics(shell=None)  # reads a magic's options as IPython does
TIMEIT = {"opt_str": "n:r:tcp:qo", "posix": False, "strict": False, "preserve_non_opts": True}  # as %timeit reads
# a magic, shell, autocall or help line, and a magic's or shell's output assigned (x = !ls, x, y = %sx ls)
MAGIC = re.compile(r"^[ \t]*(?:[\w.]+(?:[ \t]*,[ \t]*[\w.]+)*[ \t]*=[ \t]*)?(%%?\w+|!|[/,;])|\?[ \t]*$", flags=re.M)
SAFE_MAGICS = {"%time", "%%time", "%timeit", "%%timeit", "%matplotlib", "%%capture"}  # others run other code
QUIET_MAGICS = SAFE_MAGICS | {"%pinfo", "%pinfo2", "%psearch"}  # and help lines (x?), which only show help
HISTORY = re.compile(r"In|Out|_i+|_i\d+|_\d+|_[iod]h")  # IPython's record of the cells run (the book's) and outputs
MODULES = {"torch", "nn", "F", "np", "numpy", "math", "aiayn"}  # modules a cell may change without importing them
# what an exercise's answer may import unflagged (an allow-list: a library outside it may resolve names from strings,
# jinja2's Environment.getattr, say); the flagged ones above are flagged within it too
LIBRARIES = {"torch", "numpy", "math", "cmath", "collections", "itertools", "functools", "typing", "dataclasses", "re"}
LIBRARIES |= {"random", "statistics", "time", "copy", "heapq", "bisect", "fractions", "decimal", "string", "textwrap"}
LIBRARIES |= {"matplotlib", "altair", "pandas", "sacrebleu", "aiayn", "json", "enum", "abc", "numbers", "__future__"}
NEAR_COPY = 0.85  # share of matching tokens above which a function is reported as a copy of the book's code
DEFINITIONS = (ast.FunctionDef, ast.ClassDef)  # what near_copies compares
IMPORTS = (ast.Import, ast.ImportFrom)
COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
HOLD = {"tensor", "as_tensor", "Tensor", "array", "asarray", "float", "int"}  # calls that only hold data written out
NUMBER = re.compile(r"\s*[-+]?(\d+\.\d*|\.\d+|\d+e[-+]?\d+)(e[-+]?\d+)?\s*", re.I)  # a float as a string
NEAR_SOLUTION = (0.97, 0.90)  # the same for the solution, under 2 SHORT tokens and longer: short right answers converge
# a function whose tokens lie this much in runs this long from one of the book's functions is a paste with parts cut
# away (a multi-head forward without its cache branch held 84%; the honest answers of two trial classes at most 52%)
HELD = (0.75, 15)
# the share of a long reference's tokens (past 2 SHORT) in such runs, in a cell's one function and across its functions:
# a paste with statements put between its lines (94%; the honest answers of five trial classes at most 88%, where the
# exercise dictates nearly every line), and one cut into helpers (86-97%; honest cells of two functions or more, 68%)
SPLIT = (0.9, 0.8)
# the share above which a function is a copy of the book's with its local names taken alike (v0, v1, ... all one): a
# copy nested in another function, where a parameter became the enclosing function's name, numbers them otherwise (a
# nested copy of padded_tokens: 60% of its tokens as numbered, 99% alike; honest answers of eight trial classes, 84%)
ALIKE = 0.95
SPLITS = ("its function holds", "its functions together hold")
SHORT = 260  # tokens: a function this short (a few lines: the book's ngrams) is not compared; right answers converge
FLAG_CHARS = 30_000  # a cell longer than this is not parsed by the flags (and is flagged for that): their time
FLAG_SECONDS = 30.0  # the flags' time for one notebook; the cells they did not reach are flagged
LATE = f"code the flags did not read to the end (their {FLAG_SECONDS:g} s for a notebook ran out)"


def _nodes(source: str, magics: bool = False) -> list:
    """Every node of a piece of code's syntax tree ([] when it is not Python); with ``magics``, of the code as IPython
    runs it (a "%" line inside brackets is Python's modulo), and of the code its safe magics run (``%time``,
    ``%%capture``, ...) but not IPython's own calls of them ([] when a safe magic's code is not Python, or when its
    magic lines times its length pass twice ``FLAG_CHARS``: IPython reads the whole cell again for each)."""
    if len(source) > FLAG_CHARS or magics and _past_magic_bound(source):
        return []
    read, ours = (TransformerManager().transform_cell if magics else textwrap.dedent), "get_ipython" not in source
    try:
        tree, inner = ast.parse(read(source)), []
        runs = [n for n in ast.walk(tree) if str(getattr(getattr(n, "func", None), "attr", "")).endswith("_magic")]
        for call in runs:
            name, *code = [str(getattr(a, "value", "")) for a in call.args]  # (IPython's calls have constants)
            # IPython's own call where the cell names get_ipython nowhere (else the name is flagged): a safe magic's
            # code read here, any other magic named (%run), wherever it sits (x = %sx ...)
            label = "magic" if (forms := {f"%{name}", f"%%{name}"}) & QUIET_MAGICS else f"%{name}"
            call.func, call.args = (ast.Name(label), []) if ours else (call.func, call.args)
            if forms & SAFE_MAGICS:  # timeit's options read as IPython reads them
                # timeit's line: options, then code; another cell magic's line holds only options (%%capture -x)
                code = [OPTIONS.parse_options(code[0], **TIMEIT)[1], *code[1:]] if name == "timeit" else code[-1:]
                if not all(more := [_nodes(part, magics=True) for part in code]):
                    return []
                inner += [n for part in more for n in part]
    except Exception:  # noqa: BLE001  (not Python, nested past the parser's limits, or a magic's options wrong)
        return []
    return list(ast.walk(tree)) + inner


def _past_magic_bound(source: str) -> bool:
    """Whether a cell's magic, help and autocall lines times its length pass twice ``FLAG_CHARS``: IPython reads the
    whole cell again for each such line, so reading it as IPython does could take minutes."""
    return len(MAGIC.findall(source)) * len(source) > 2 * FLAG_CHARS


def _named(text: str) -> bool:
    """A string that names what the flags look for, or a piece of a dunder name ("__glo" + "bals__")."""
    parts = text.split(".") if DOTTED.fullmatch(text) or text in SUSPECT_CALLS - {"open"} | AS_STRINGS else []
    pieces = text.startswith("__") or text.endswith("__") or re.search(r"__\w+__|aiayn\.course", text)
    return pieces or any(x in SUSPECT_CALLS | SUSPECT_MODULES or x.startswith("_") for x in parts)


def _code_in(text: str) -> str | None:
    """The code that a string holds, as Python reads it or as pandas' query and eval do (``@name``: a caller's)."""
    return next((code for code in (text, text.replace("@", "")) if re.search(r"[(=]", code) and _nodes(code)), None)


def _written_out(node) -> bool:
    """A value returned or assigned that is data written out (``return [[5, 7, 4]]``, ``return 27.31``, ``answers =
    {(10, 0): [[5, 7, 4]]}``, ``table = {"1,100": 1e-05, ...}``): nothing computed, a number other than 0 and 1 in it,
    and if assigned, nested, a dict, or four such numbers or more."""
    inner = list(ast.walk(node.value))
    calls = [n for n in inner if isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", 0)) in HOLD]
    held = {id(m) for n in calls for part in [n.func, *n.keywords] for m in ast.walk(part)} | set(map(id, calls))
    inner = [n for n in inner if id(n) not in held]
    nested = any(isinstance(n, (ast.List, ast.Tuple, ast.Dict, ast.Set)) for n in inner[1:])
    numbers = [n.value for n in inner if isinstance(n, ast.Constant) and type(n.value) in (int, float)]
    computed = any(isinstance(n, (ast.Name, ast.Call, ast.Attribute)) for n in inner)
    table = nested or isinstance(node.value, ast.Dict) or sum(v not in (0, 1) for v in numbers) >= 4
    return not computed and any(v not in (0, 1) for v in numbers) and (table or isinstance(node, ast.Return))


def _root(node) -> str | None:
    """The name an expression starts from: ``layer`` in ``layer(x).pe[0]``."""
    while isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)):
        node = getattr(node, "func", getattr(node, "value", None))
    return getattr(node, "id", None)


def _binds(statement) -> dict[str, bool]:
    """The names a statement binds, its assignments' targets and a definition's name: name -> whether it is a class."""
    targets = [*getattr(statement, "targets", [statement.target] if isinstance(statement, ast.AnnAssign) else [])]
    targets += [m.target for m in ast.walk(statement) if isinstance(m, ast.NamedExpr)]  # and (x := ...) inside
    names = {m.id: False for t in targets for m in ast.walk(t) if isinstance(m, ast.Name)}
    return names | ({statement.name: isinstance(statement, ast.ClassDef)} if isinstance(statement, DEFINITIONS) else {})


def _type_of(node) -> bool:
    """``type(x)``."""
    return isinstance(node, ast.Call) and getattr(node.func, "id", None) == "type" and len(node.args) == 1


def _students(nodes: list, stored: list, given) -> set[int]:
    """The uses of names in a cell's ``nodes`` that are the student's own: a function's parameters and locals (but a
    ``global`` one), and a name from the statement that binds it (``stored``: the cell's bindings) to the end of its
    block (the cell, a loop's or a branch's body), a loop's variable in its body, and ``given``'s names everywhere."""
    own, at = set(), {name: [(0, 1 << 30)] for name in given}  # at: name -> [(after line, to line)]
    top = {n.name for m in nodes[:1] for n in getattr(m, "body", []) if isinstance(n, DEFINITIONS)}  # (when it runs)
    scopes = [(list(ast.walk(f)), top) for f in nodes if isinstance(f, (ast.FunctionDef, ast.Lambda))]
    comps = [c for c in nodes if isinstance(c, COMPREHENSIONS)]
    scopes += [(list(set(ast.walk(c)) - set(ast.walk(c.generators[0].iter))), set()) for c in comps]
    stored = set(stored)  # (each set made once: a cell of thousands of nodes is read in time linear in its size)
    for inner, later in scopes:  # (a comprehension's variables are its own, but in the iterable it reads first)
        local = {getattr(m, "id", getattr(m, "arg", 0)) for m in set(inner) & stored} | later
        local -= {g for m in inner if isinstance(m, (ast.Global, ast.Nonlocal)) for g in m.names}
        own |= {id(m) for m in inner if getattr(m, "id", None) in local}
    for block in [b for b in nodes if isinstance(getattr(b, "body", None), list) and not isinstance(b, DEFINITIONS)]:
        end, target = getattr(block, "end_lineno", None) or 1 << 30, getattr(block, "target", ast.Pass())
        names = [(k, s.end_lineno) for s in block.body for k in _binds(s)]  # after the statement that binds it,
        names += [(m.target.id, m.lineno - 1) for s in block.body for m in ast.walk(s) if isinstance(m, ast.NamedExpr)]
        after = getattr(getattr(block, "iter", block), "end_lineno", 0)  # a loop's in its body (past its iterable)
        names += [(m.id, after) for m in ast.walk(target) if isinstance(m, ast.Name)]
        for k, start in names:
            at.setdefault(k, []).append((start, end))
    held = [(n, at.get(getattr(n, "attr", getattr(n, "id", None)), [])) for n in nodes if hasattr(n, "lineno")]
    return own | {id(n) for n, spans in held if any(a < n.lineno <= b for a, b in spans)}


def suspect(source: str, modules=(), book=(), built=(), given=(), allowed=()) -> list[str]:
    """What in a cell of the student's reaches past its own function: frames, the interpreter's machinery, other
    modules, torch's operator registry, code built from strings, a module's attribute replaced (``modules``: names the
    student's cells import) or of any object but ``self`` and ``cls`` (the checks observe what the student's
    function does to its arguments), an answer written out, and ``book``: the book's own implementation of what the
    student was asked to write, named anywhere in the student's cells (called outside a function, it can fill a table
    that the function reads), and ``built``: what the book's cells built with that code (``layer``), named as a
    variable; where a name is the student's own (``_students``; ``given``: what the student's earlier cells bound at
    their top level, name -> whether it is a class), it is not the book's; ``allowed``: what of the book's package a
    student's cell may import (what the book's cells import, and what the exercises hand over)."""
    found, nodes = ["a shell command"] * ("!" in MAGIC.findall(source)), _nodes(source, magics=True)  # magics: below
    # a module's name that the cell neither imports (flagged as such) nor binds: the book's cells' (sys, os, ...)
    stored = [n for n in nodes if type(getattr(n, "ctx", n)) in (ast.Store, ast.arg, ast.alias)]  # names it binds
    bound = {v for n in stored for v in map(vars(n).get, ("id", "arg", "name"))}
    free = SUSPECT_CALLS | SUSPECT_MODULES - bound
    book = set(book) | {a.asname for n in nodes if isinstance(n, ast.ImportFrom) for a in n.names if a.name in book}
    book, called = book - {None}, {id(n.func) for n in nodes if isinstance(n, ast.Call)}
    bare = {id(n.func) for n in nodes if isinstance(n, ast.Call) and not n.args and not n.keywords}
    defs = [c for c in nodes if isinstance(c, ast.ClassDef)]  # self and cls are exempt in their methods: inside
    inside = {id(m) for c in defs for f in c.body if isinstance(f, ast.FunctionDef) for m in ast.walk(f)}
    classes = {c.name for c in defs} | {name for name, kind in dict(given).items() if kind}
    theirs = _students(nodes, stored, given)
    for n in nodes:
        history = isinstance(n, ast.Name) and HISTORY.fullmatch(n.id) and n.id not in bound  # (not the student's)
        if isinstance(n, ast.Name) and (n.id in free or n.id.startswith(("__", "%"))) or history:
            found.append(f"the magic {n.id}" if n.id[0] == "%" else n.id)
        elif isinstance(n, (*DEFINITIONS, ast.alias)) and (x := getattr(n, "asname", n.name)) in SUSPECT_CALLS:
            found.append(f"a definition of {x}")  # (def globals(), def __import__: builtins a namespace can shadow)
        elif isinstance(n, ast.MatchClass):  # case object(__code__=c): attributes read by a pattern
            read = [a for a in n.kwd_attrs if a in book | SUSPECT_ATTRIBUTES | PYTORCHS or a.startswith("_")]
            found += [f"the book's {a}" if a in book else f".{a}" for a in read]
        elif isinstance(n, ast.Name) and n.id == "getattr" and id(n) not in called:  # (fetch = getattr; fetch(x, name))
            found.append("getattr handed on")
        elif isinstance(n, ast.Call) and getattr(n.func, "id", "") == "getattr":
            name = n.args[1].value if len(n.args) > 1 and isinstance(n.args[1], ast.Constant) else None
            if not isinstance(name, str):
                found.append("getattr with a computed name")
            elif name in READS | book or name.startswith("_") or getattr(n.args[0], "id", 0) in classes:
                found.append(f".{name}")
        elif isinstance(n, ast.Attribute) and getattr(n.value, "id", None) in classes:  # (a method's self: any object)
            found.append(f"{n.value.id}.{n.attr} (an attribute taken from the class, not from an object of it)")
        elif _type_of(getattr(n, "func", None)) or isinstance(n, (ast.Attribute, ast.Assign)) and _type_of(n.value):
            # type(layer)(...): a chapter's class; but for its name (type(err).__name__)
            found += ["an object's class (type(...)) called, read or kept"] * (getattr(n, "attr", 0) != "__name__")
        elif isinstance(n, ast.Attribute) and (n.attr in SUSPECT_ATTRIBUTES or n.attr.startswith("_")):
            if (n.attr, _root(n.value)) not in {("__init__", "super"), ("compile", "re")}:  # super().__init__, re's
                found.append(f".{n.attr}")
        elif (named := getattr(n, "attr", getattr(n, "id", getattr(n, "name", None)))) in PYTORCHS:
            found.append(f"PyTorch's own {named}")
        elif isinstance(n, ast.keyword) and n.arg == "label_smoothing" or getattr(n, "value", 0) == "label_smoothing":
            found.append("PyTorch's own label_smoothing")  # (F.cross_entropy's; by name, or by position below)
        elif isinstance(n, ast.Attribute) and n.attr in RESOLVING and id(n) not in bare:  # (model.eval(): no arguments)
            found.append(f".{n.attr} with arguments (pandas': names resolved from a string)")
        elif isinstance(n, ast.Call) and (at := SMOOTHING.get(getattr(n.func, "attr", getattr(n.func, "id", "")))):
            starred = any(isinstance(a, ast.Starred) for a in n.args[: at + 1])
            found += ["PyTorch's own label_smoothing"] * (starred or len(n.args) > at)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and (_named(n.value) or n.value in book):
            found.append(f"the name {n.value[:40]} as a string")
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and NUMBER.fullmatch(n.value):
            found.append("a number written as a string")
        elif isinstance(n, ast.Constant) and isinstance(n.value, bytes) and len(n.value) > 2:
            found.append("data written as bytes")
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and (code := _code_in(n.value)):
            found += [f"{x} (in a string of code)" for x in suspect(code, modules, book, built, given, allowed)]
        elif isinstance(n, (ast.Return, ast.Assign)) and n.value is not None and _written_out(n):
            found.append(f"an answer written out ({ast.unparse(n)[:40]})")
        elif isinstance(n, IMPORTS):
            found += _imports(n, book, allowed)
        for target in [n] if isinstance(n, (ast.Attribute, ast.Subscript)) and type(n.ctx) is not ast.Load else []:
            root, chain = target, []
            while isinstance(root, (ast.Attribute, ast.Subscript)):
                root, chain = root.value, chain + [root]
            name, attribute = getattr(root, "id", None), any(isinstance(x, ast.Attribute) for x in chain)
            mine = name in ("self", "cls") and id(target) in inside  # an attribute of the method's own object
            if chain and (name in MODULES | set(modules) | {None} or attribute and not mine):
                found.append(f"a change to {ast.unparse(target)}")
        named = n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", None)
        if (named in book or named in built and isinstance(n, ast.Name)) and type(getattr(n, "ctx", 0)) is ast.Load:
            found += [f"the book's {named}"] * (id(n) not in theirs)
    return sorted({x for x in found if x.removesuffix(" (in a string of code)") not in set(found) - {x}})


def _imports(n, book=(), allowed=()) -> list[str]:
    """What an import flags: the suspect modules and names, the book's package but what is ``allowed`` (``suspect``)
    and the names flagged as the book's there, private names, libraries outside the allow-list, and ``*``."""
    names = ([n.module or ""] if isinstance(n, ast.ImportFrom) else []) + _imported(n)
    bad = [m for m in names if m.split(".")[0] in SUSPECT_MODULES or m.startswith(PACKAGES)]
    found = [f"import {m}" for m in bad + [m for m in names if m.split(".")[-1] in READS]]
    books = [m for m in _imported(n) if m.split(".")[0] == "aiayn" and m not in allowed]
    books = [m for m in books if m.split(".")[-1] not in {*book, *allowed} and m[:12] != "aiayn.course"]
    found += [f"import {m} (the book's code, in a cell of the student's)" for m in books[:1]]
    found += [f"import {m} (a private name)" for m in names if "._" in f".{m}" and m[:10] != "__future__"][:1]
    tops = {m.split(".")[0] for m in names} - LIBRARIES - SUSPECT_MODULES - {""}  # (an allow-list)
    found += [f"import {m} (not a library the exercises use)" for m in sorted(tops)]
    return found + ["the book's code, imported with *" for a in n.names if a.name == "*"]


def _imported(n) -> list[str]:
    """What an import names, in full: ``from a.b import c`` names a.b.c, ``import a.b`` a.b."""
    return [f"{n.module}.{a.name}" if isinstance(n, ast.ImportFrom) else a.name for a in n.names]


def _tokens(node) -> list[str]:
    """A definition's syntax tree as tokens, without its name, docstrings and annotations, its arguments and local
    names numbered in order: a pasted copy under another name or with renamed variables has the same tokens."""
    node = copy.deepcopy(node)
    node.name, node.decorator_list, names = "f", [], {}
    for n in ast.walk(node):
        if isinstance(n, DEFINITIONS) and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant):
            n.body = n.body[1:] or [ast.Pass()]  # a docstring
        if isinstance(n, (ast.FunctionDef, ast.AnnAssign)):  # (ast.dump shows a node's own fields, not the other's)
            n.returns, n.annotation = None, ast.Constant(None)
        elif isinstance(n, ast.arg):
            n.annotation, n.arg = None, names.setdefault(n.arg, f"v{len(names)}")
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            names.setdefault(n.id, f"v{len(names)}")
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id in names:
            n.id = names[n.id]
    return re.findall(r"\w+|[^\w\s]", ast.dump(node, annotate_fields=False))


def near_copies(source: str, references: dict[str, object], deadline: float = float("inf")) -> list[str]:
    """The references (name -> function ast) that a function of ``source`` nearly copies, with the share of tokens,
    the book's functions that hold most of one (a paste with parts cut away), and the long references that the
    functions of ``source`` together hold most of (a paste cut into helpers); compared until ``deadline``."""
    found, refs, late, split = {}, {name: _tokens(ref) for name, ref in references.items()}, [], []
    nodes = [n for n in _nodes(source, magics=True) if isinstance(n, DEFINITIONS)]
    whole = [re.sub(r"^v\d+$", "v", t) for n in nodes for t in _tokens(n)]  # (local names alike)
    least = SPLIT[len(nodes) > 1]
    for name, b in [(name, b) for name, b in refs.items() if whole and len(b) > 2 * SHORT]:
        b = [re.sub(r"^v\d+$", "v", t) for t in b]
        match = difflib.SequenceMatcher(None, whole, b, autojunk=False)
        if time.monotonic() < deadline and match.quick_ratio() * (len(whole) + len(b)) >= 2 * least * len(b):
            if (held := sum(m.size for m in match.get_matching_blocks() if m.size >= HELD[1]) / len(b)) >= least:
                split.append((name, f"{SPLITS[len(nodes) > 1]} {held:.0%} of the tokens of {name}"))
    for node in nodes:
        if late := [LATE] * (time.monotonic() > deadline):
            break
        a = _tokens(node)
        for name, b in refs.items():
            book = not name.startswith("the book's solution")
            least = NEAR_COPY if book else NEAR_SOLUTION[len(b) >= 2 * SHORT]
            match = difflib.SequenceMatcher(None, a, b, autojunk=False)
            # long enough, and alike enough in length and tokens to reach the share (bounds of ratio(), which is costly)
            near = min(len(a), len(b)) > SHORT and match.real_quick_ratio() >= least and match.quick_ratio() >= least
            if near and (share := match.ratio()) >= least or book and (share := _alike(a, b)) >= ALIKE:
                found[f"resembles {name}"] = max(found.get(f"resembles {name}", 0), share)
            elif book and len(a) > SHORT and match.quick_ratio() * (len(a) + len(b)) >= 2 * HELD[0] * len(a):
                held = sum(m.size for m in match.get_matching_blocks() if m.size >= HELD[1]) / len(a)
                found[f"holds runs of {name}"] = max(found.get(f"holds runs of {name}", 0), held)
    split = [line for name, line in split if f"resembles {name}" not in found]  # (a paste found whole, named once)
    return [f"{what} ({share:.0%} of its tokens)" for what, share in found.items() if share >= HELD[0]] + split + late


def _alike(a: list[str], b: list[str]) -> float:
    """The share of tokens two long functions have in common with their local names alike (0 where under ``ALIKE``)."""
    if min(len(a), len(b)) <= SHORT:
        return 0.0
    match = difflib.SequenceMatcher(None, *[[re.sub(r"^v\d+$", "v", t) for t in x] for x in (a, b)], autojunk=False)
    return match.ratio() if match.real_quick_ratio() >= ALIKE and match.quick_ratio() >= ALIKE else 0.0


def references(assignments, solutions: list[str]) -> dict[str, object]:
    """The book's code that the assignments ask the student to write anew: each reference's definition and the
    reference solutions of the instructor's copy, as syntax trees."""
    import inspect

    found = {}
    for path in [path for a in assignments for path in a.references]:
        try:
            source = inspect.getsource(kernel.reference_source(path)[1])
        except (OSError, TypeError):  # written in C
            continue
        found |= {path: n for n in _nodes(source)[1:2] if isinstance(n, DEFINITIONS)}
    solved = [n for source in solutions for n in _nodes(source) if isinstance(n, DEFINITIONS)]
    return found | {f"the book's solution ({n.name})": n for n in solved}


# ----------------------------------------------------------------------------------------------------------
# The kernel of a submission: an unprivileged sandbox that sees an allow-list
# ----------------------------------------------------------------------------------------------------------


def sandbox_problem() -> str:
    """Why a sandboxed kernel cannot start on this machine ("" when it can)."""
    if shutil.which("bwrap") is None or shutil.which("setpriv") is None:
        return "bubblewrap is not installed (Debian, Ubuntu: apt-get install bubblewrap; Fedora: dnf install it)"
    run = subprocess.run(["bwrap", *_base(), "--", *_unprivileged(FIRST_UID), "true"], capture_output=True)
    if run.returncode:
        why = run.stderr.decode(errors="replace").strip() or run.returncode
        return f"bubblewrap cannot create a sandbox here ({why}): user namespaces off?"
    return ""


def _unprivileged(uid: int) -> list[str]:
    """Inside the sandbox, before the kernel starts: a grader that is root becomes ``uid``, a user with no account,
    no capabilities left and none to gain (bubblewrap sets no_new_privs), in a user namespace that can hold no other
    (there, it could mount a file system in memory past its disk limit)."""
    own = ["bwrap", "--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--die-with-parent"]
    own += ["--dev-bind", "/", "/", "--"]  # the same view of the files
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *own] if os.geteuid() == 0 else []


def _base() -> list[str]:
    """Namespaces and the system's read-only folders, and nothing else of the file system. As root, bubblewrap keeps
    only the right to become the kernel's user (``_unprivileged``); otherwise it runs in a user namespace of its own."""
    box = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--new-session"]
    if os.geteuid() == 0:
        box += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        box += ["--unshare-user", "--disable-userns", "--cap-drop", "ALL"]
    box += ["--dev", "/dev", "--proc", "/proc", "--perms", "1777", "--size", str(256 << 20), "--tmpfs", "/tmp"]
    return box + [a for f in SYSTEM for a in ("--ro-bind-try", f, f)]


class SandboxKernelManager(AsyncKernelManager):
    """A kernel in a bubblewrap sandbox, as an unprivileged user with no capabilities. It sees the system's folders,
    the Python environment, the package without its course (but ``kernel`` and ``inputs``), the data and model
    caches, the book's results and models, all read-only, and a fresh writable copy of its submission's folder; no
    course folder, no gradebook, no notebooks of the book, no network. It talks to the grader over Unix sockets in a
    folder of its own, within limits on memory, processes and file size."""

    memory_mb = Integer(4096, help="address space of a kernel, in MiB").tag(config=True)
    disk_mb = Integer(512, help="what a kernel may write to disk, in MiB (10,000 files at most)").tag(config=True)
    processes = Integer(64, help="processes and threads of a kernel").tag(config=True)
    sandbox = Bool(True, help="run the kernel in bubblewrap (False: only to try a course out)").tag(config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.context = zmq.asyncio.Context()  # its sockets refuse a message over MAX_MESSAGE bytes
        self.context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE)
        self.context.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)  # messages waiting to be read: at most this many
        self.sandbox_dir, self.disk_full = Path(tempfile.mkdtemp(prefix="aiayn-kernel-")), False  # (the disk watch's)
        self.uid = FIRST_UID + secrets.randbelow(1 << 30)  # a user id of its own: the process limit counts per user
        if self.sandbox:
            self.transport, self.ip = "ipc", str(self.sandbox_dir / "kernel-ipc")
            self.connection_file = str(self.sandbox_dir / "kernel.json")

    def client(self, **kwargs):
        return super().client(context=self.context, **kwargs)

    async def _async_post_start_kernel(self, **kwargs) -> None:
        await super()._async_post_start_kernel(**kwargs)
        threading.Thread(target=self._watch_disk, args=(self.provisioner.process,), daemon=True).start()

    def _watch_disk(self, process) -> None:
        """Twice a second while the kernel runs: past ``disk_mb`` MiB in its folder, or 10,000 files and folders, it
        is killed; so it is when its folder cannot be measured."""
        while process.poll() is None and not self.over_disk():
            time.sleep(0.5)
        process.kill()  # (nothing, once it has ended)

    def over_disk(self) -> bool:
        """Whether the kernel's folder holds more than ``disk_mb`` MiB or 10,000 files and folders, or cannot be
        measured (then ``disk_full`` is set). The grader also asks after each cell: a write that ends between two
        looks of the watch is charged to its own cell, not to the next."""
        try:  # find walks a folder nested at any depth (Python's recursion does not)
            found = _listing(self.sandbox_dir)
            self.disk_full |= sum(entry[3] for entry in found) > self.disk_mb << 20 or len(found) > 10_000
        except Exception:  # noqa: BLE001  (what cannot be measured is not let run)
            self.disk_full = True
        return self.disk_full

    def format_kernel_cmd(self, extra_arguments=None) -> list[str]:
        self.kernel_spec.interrupt_mode = "message"  # a signal to the sandbox would not reach the kernel inside it
        cmd = super().format_kernel_cmd(extra_arguments)
        # its output capped (kernel.load_ipython_extension), and what it writes to its file descriptors 1 and 2 (which
        # ipykernel echoes) kept from the grader's own terminal
        cmd = ["sh", "-c", 'exec "$@" >/dev/null 2>&1', "kernel", *cmd, "--IPKernelApp.extensions=aiayn.course.kernel"]
        limits = ["prlimit", f"--as={self.memory_mb << 20}", f"--nproc={self.processes}", f"--fsize={64 << 20}"]
        limits += ["--nofile=256", "--"]  # open files: each deleted while open keeps its disk space unseen
        if not self.sandbox:  # (no parent poller: a thread the kernel starts late, which a call would count as the
            return limits + ["env", "-u", "JPY_PARENT_PID", *cmd]  # student's; the kernel is killed when done)
        self.receive(None)  # (its submission comes when it is given one: it may start while another is graded)
        return limits + ["bwrap", *_base(), *self._view(), "--", *_unprivileged(self.uid)] + cmd

    def receive(self, folder: Path | None) -> None:
        """A copy of the submission's folder (but its notebooks) in the kernel's working folder, owned by the kernel's
        user: before any code of the submission runs in it."""
        (work := self.sandbox_dir / "work").mkdir(exist_ok=True), (self.sandbox_dir / "home").mkdir(exist_ok=True)
        if folder and self.sandbox:  # (without the sandbox, the kernel runs in the submission's own folder)
            shutil.copytree(folder, work, ignore=shutil.ignore_patterns("*.ipynb"), symlinks=True, dirs_exist_ok=True)
        for path in [self.sandbox_dir, *self.sandbox_dir.rglob("*")] if os.geteuid() == 0 else []:
            os.chown(path, self.uid, self.uid, follow_symlinks=False)

    def _view(self) -> list[str]:
        from aiayn import ROOT, data

        package = Path(kernel.__file__).resolve().parents[1]
        readable = [Path(sys.base_prefix), Path(sys.prefix), package, data.cache_dir(), data.pretrained_dir()]
        readable += [ROOT / "results", ROOT / "pretrained"]
        readable = sorted({p.resolve() for p in readable if p.exists()})  # a folder before what it holds
        mounts = readable + [self.sandbox_dir]
        parents = {a for p in mounts for a in p.parents if not any(a.is_relative_to(m) for m in mounts)}
        box = [arg for a in sorted(parents - {Path("/")}) for arg in ("--perms", "0755", "--dir", str(a))]
        box += [arg for path in readable for arg in ("--ro-bind", str(path), str(path))]
        course = package / "course"  # the grading package, but for the modules that answer calls and hold inputs
        box += ["--tmpfs", str(course)]
        box += [a for p in (course / "kernel.py", course / "inputs.py") for a in ("--ro-bind", str(p), str(p))]
        box += ["--ro-bind", "/dev/null", str(course / "__init__.py"), "--remount-ro", str(course)]
        box += ["--bind", str(self.sandbox_dir), str(self.sandbox_dir), "--bind", str(self.sandbox_dir / "work"), WORK]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": os.environ.get("LANG", "C.UTF-8")}
        env |= dict.fromkeys(("HOME", "MPLCONFIGDIR", "IPYTHONDIR"), self.sandbox_dir / "home")
        # PYTHONSAFEPATH: no module of its own folder stands in for the book's ones; TORCH_COMPILE_DISABLE:
        # torch.compile runs the code it is given (its compiled frames are code the call watch has never seen)
        env |= {"USER": "student", "LOGNAME": "student", "TMPDIR": "/tmp", "PYTHONSAFEPATH": 1}
        env |= {"TORCH_COMPILE_DISABLE": 1}
        env |= {"AIAYN_DATA": data.cache_dir().resolve(), "AIAYN_PRETRAINED": data.pretrained_dir().resolve()}
        # nothing of the grader's environment (its secrets, a fixed seed of the checks' inputs)
        box += ["--clearenv"] + [arg for name, value in env.items() for arg in ("--setenv", name, str(value))]
        return box + ["--unsetenv", "JPY_PARENT_PID", "--chdir", WORK]  # bubblewrap ends the kernel with us


# ----------------------------------------------------------------------------------------------------------
# Executing a submission: checks in this process, limits, and statements that cannot be stopped
# ----------------------------------------------------------------------------------------------------------


class StuckCell(Exception):
    """A cell (or a check's call) that ran past its time limit and an interrupt: its kernel is killed, and the
    notebook graded again with that statement skipped."""

    stops_grading = True  # a check that meets it stops (the checks see any other exception as the student's)


class Execute(NbGraderExecute):
    """nbgrader's Execute, for the book's checks: each kernel in a sandbox; a check cell never runs in the kernel (its
    check runs here, and each call of the student's function goes to the kernel as a request and comes back as data);
    limits on a notebook's output and time; a statement that does not stop when interrupted, or that ends its kernel,
    is skipped alone: the notebook is graded again, with the statements before and after it."""

    interrupt_grace = Float(5.0, help="seconds a cell may take to stop after an interrupt").tag(config=True)
    max_stuck = Integer(16, help="statements skipped at most before a notebook is not graded").tag(config=True)
    notebook_seconds = Float(1800, help="wall time of a notebook, all its runs together").tag(config=True)
    cell_output = Integer(1_000_000, help="characters of output kept per cell").tag(config=True)
    notebook_output = Integer(4_000_000, help="characters of output kept per notebook").tag(config=True)

    kernel_manager_class = SandboxKernelManager
    raise_on_iopub_timeout = True  # a message refused for its size never arrives: see async_execute_cell

    def preprocess(self, nb, resources=None, km=None):
        from aiayn.course.checks import ASSIGNMENTS

        self._checks = {f"{a.key}_{c.key}": (a.key, c.key) for a in ASSIGNMENTS.values() for c in a.checks}
        # the kernel started while the notebook before ran (its start, mostly importing PyTorch, takes a core while
        # that notebook takes the other), and one started now for the next notebook
        self._ready, SPARE[:], self._kernel = SPARE[:], [], nb.metadata.get("kernelspec", {}).get("name", "python3")
        if self.config.SandboxKernelManager.get("sandbox", True):  # (a kernel without it starts in its submission)
            SPARE.append(self.kernel_manager_class(kernel_name=self._kernel, config=self.config))
            run_sync(SPARE[0].start_kernel)(extra_arguments=self.extra_arguments)
        self._skipped, self._deadline, self._folders = {}, time.monotonic() + self.notebook_seconds, self._ready[:]
        while True:
            self._out, self._cell, self._stmt, self._call_timeout = {}, None, None, None
            try:  # (the flags first, once: a grader's error in them leaves no kernel's folder behind)
                self._flag(nb, resources, ASSIGNMENTS) if not self._skipped else None
                return super().preprocess(copy.deepcopy(nb), resources, km)
            except (StuckCell, DeadKernelError) as err:
                if self._cell is None or len(self._skipped) >= self.max_stuck:
                    raise
                why = _ended(self._folders[-1]) if isinstance(err, DeadKernelError) else str(err)
                self._skipped[(self._cell, self._stmt)] = why
                self.log.warning("cell %d %s; grading again without it", self._cell, why)
            finally:  # the kernels' folders (jupyter_client's cleanup_resources does not call an override)
                subprocess.run(["rm", "-rf", "--", *[m.sandbox_dir for m in self._folders]], **QUIET)  # at any depth

    def create_kernel_manager(self):
        # the kernel started for this notebook, if it still runs (self._ready: in self._folders, taken or not)
        ready = [km for km in self._ready if km.kernel_name == self._kernel and km.provisioner.process.poll() is None]
        self.km, self._ready = ready[0] if ready else super().create_kernel_manager(), []
        self._folders += [] if ready else [self.km]
        self.km.receive(Path(self.resources.get("metadata", {}).get("path") or "."))
        return self.km

    def _update_display_id(self, display_id, msg) -> None:
        """Displays are never updated in place: an update would pass the limits on output."""

    def _flag(self, nb, resources, assignments) -> None:
        """Flags on the student's own cells: code that reaches past its function, and copies of the book's code or of
        the solution cells of the instructor's source notebook (the gradebook holds only the released cells)."""
        from nbgrader.coursedir import CourseDirectory

        from aiayn.course.assignments import BEGIN, END, has_solution

        ids = {c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells}
        graded = {a for key, (a, _) in self._checks.items() if key in ids}
        info, solutions, source = (resources or {}).get("nbgrader", {}), [], nbformat.v4.new_notebook()
        if "assignment" in info:
            folder = CourseDirectory(config=self.config).format_path("source", ".", info["assignment"])
            with contextlib.suppress(OSError, ValueError):
                source = nbformat.read(Path(folder) / f"{info['notebook']}.ipynb", as_version=4)
            solutions = [c.source.replace(BEGIN, "").replace(END, "") for c in source.cells if has_solution(c.source)]
        refs = references([assignments[a] for a in graded if a in assignments], solutions)
        book_cells = {c.source.strip() for c in source.cells if not has_solution(c.source)}  # as released
        mine = [c for c in nb.cells if c.cell_type == "code" and not c.metadata.get("nbgrader", {}).get("locked")]
        mine = [c for c in mine if c.source.strip() not in book_cells]  # the book's own cells
        deadline = time.monotonic() + FLAG_SECONDS  # the flags' time: a cell can be made costly to read
        trees = [n for c in mine if time.monotonic() < deadline for n in _nodes(c.source, magics=True)]
        modules = {(a.asname or a.name).split(".")[0] for n in trees if isinstance(n, IMPORTS) for a in n.names}
        # the book's own code (not torch's) that an assignment asks the student to write anew, but what it hands over
        asked = [(p, assignments[a].given) for a in graded for p in assignments[a].references if p[:6] == "aiayn."]
        book = {p.split(".")[2] for p, handed in asked if p.split(".")[2] not in handed}
        allowed = {name for _, handed in asked for name in handed}  # what the exercises hand over, and (below) import
        built, given, self._defined = set(), {}, {}  # built with the book's code, the student's names (grows with each
        # of the student's cells: what the cells before it bound), the book's definitions (for the call watch)
        for c in [c for c in source.cells if c.cell_type == "code" and not has_solution(c.source)]:
            text = TransformerManager().transform_cell(c.source)  # as the kernel runs it
            for n in (_nodes(text) or [ast.Module([])])[0].body:
                self._defined |= {n.name: text} if isinstance(n, DEFINITIONS) else {}
                allowed |= set(_imported(n)) if isinstance(n, IMPORTS) else set()  # (a student's cell may too)
                # what a book's cell builds with the book's code is the book's too: layer = PositionalEncoding(...), a
                # dict or a list of such, a function that calls it
                uses = {m.id for m in ast.walk(getattr(n, "value", n)) if isinstance(m, ast.Name)}
                built |= set(_binds(n)) if uses & (book | built) else set()
        self._chapter, self._watched = sorted(set(self._defined) - book - allowed), {}  # its other definitions
        for cell in mine:
            if time.monotonic() > deadline:  # (a cell longer than FLAG_CHARS is code the flags cannot read)
                cell.metadata.setdefault("aiayn", {})["flags"] = [LATE]
                continue
            flags = [f"uses {', '.join(x)}" for x in [suspect(cell.source, modules, book, built, given, allowed)] if x]
            given |= {k: v for m in _nodes(cell.source, True)[:1] for s in m.body for k, v in _binds(s).items()}
            flags += ["code the flags cannot read"] * (bool(cell.source.strip()) and not _nodes(cell.source, True))
            if flags := flags + near_copies(cell.source, refs, deadline):
                cell.metadata.setdefault("aiayn", {})["flags"] = flags

    def _get_timeout(self, cell):
        timeout = self._call_timeout or super()._get_timeout(cell) or self.notebook_seconds
        return max(1.0, min(timeout, self._deadline - time.monotonic()))

    def preprocess_cell(self, cell, resources, index):
        self._cell, self._stmt = index, None
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code":
            return cell, resources
        if time.monotonic() > self._deadline:
            why = f"not run: the notebook ran past its time limit ({self.notebook_seconds:g} s)"
            cell.outputs = [_error_output("NotebookTimeLimit", why)]
        elif meta.get("grade") and meta.get("grade_id") not in self._checks:  # no graded cell runs in the kernel
            cell.outputs = [_error_output("Failed", "no check of the course grades this cell (see checks.py)")]
        elif meta.get("grade"):
            self._check_cell(cell, index, *self._checks[meta["grade_id"]])
        elif (index, None) in self._skipped:
            resources = self._by_statement(cell, resources, index)
        else:
            cell, resources = super().preprocess_cell(cell, resources, index)
        if cut := self._out.get(("cut", index)):  # for the report, which never reads the text a cell printed
            cell.metadata.setdefault("aiayn", {})["cut"] = cut
        self.nb.cells[index] = cell  # the cell as graded (nbclient leaves the last code it ran for this index here)
        return cell, resources

    def _by_statement(self, cell, resources, index):
        """A cell that was stopped, run again one top-level statement at a time, without the statements stopped."""
        source = cell.source  # as the Python that IPython runs for it: magic and shell lines as the calls they are
        # what IPython cannot transform runs as it is, and fails there; so does a cell past the flags' bound on magics
        if not _past_magic_bound(source):
            with contextlib.suppress(Exception):
                source = TransformerManager().transform_cell(source)
        module, at = _nodes(source)[:1], []  # no module for code that is not Python: the cell is skipped whole
        for node in module[0].body if module else []:
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            if at and first <= at[-1][1]:
                at[-1][1] = node.end_lineno
            else:
                at.append([first, node.end_lineno])
        lines, outputs = source.splitlines(keepends=True), []
        if not at:
            outputs.append(_error_output("CellStopped", f"cell {index} {self._skipped[(index, None)]}: skipped"))
        for j, (first, last) in enumerate(at):
            self._stmt = j
            if (index, j) in self._skipped:
                why = f"lines {first}-{last} of cell {index} {self._skipped[(index, j)]}: skipped, the rest ran"
                outputs.append(_error_output("CellStopped", why))
                continue
            part = nbformat.v4.new_code_cell("".join(lines[first - 1 : last]), metadata=cell.metadata)
            part, resources = super().preprocess_cell(part, resources, index)
            outputs += part.outputs
        cell.outputs = outputs
        cell.metadata.setdefault("aiayn", {})["stopped"] = self._skipped[(index, None)]
        return resources

    def _check_cell(self, cell, index: int, assignment: str, key: str) -> None:
        """A check cell: its check runs here; its outputs are the check's verdict, and only that."""
        from aiayn.course.checks import ASSIGNMENTS, feedback, verdict

        if (index, None) in self._skipped:
            c = next(c for c in ASSIGNMENTS[assignment].checks if c.key == key)
            message, flags = f"your function {self._skipped[(index, None)]}", []
        else:
            c, message, flags = verdict(assignment, key, lambda request: self._call(request, index))
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=feedback(c, message) + "\n")]
        cell.outputs += [_error_output("Failed", message)] if message else []
        cell.metadata["aiayn"] = {"check": {"passed": not message, "message": message, "flags": flags}}

    def _call(self, request: dict, index: int) -> dict:
        """One call of the student's function, in the kernel: the request goes in as code, the answer comes back as
        data in a file of the kernel's folder (only tensors, numbers, strings and containers of them can be read)."""
        import torch

        path = str(self.km.sandbox_dir / f"answer-{secrets.token_hex(16)}")
        # what the call watch looks for, found here: not from the kernel's modules, which the student's code can change
        if (refs := tuple(request["references"])) not in self._watched:  # (once per notebook and assignment)
            self._watched[refs] = kernel.watched(list(refs), defined=self._defined, chapter=self._chapter)
        request |= {"answer": path, "watched": self._watched[refs]}
        torch.save(request, buffer := io.BytesIO())
        data = base64.b64encode(buffer.getvalue())
        # a fresh copy of the module that answers, run from its file: not the one a submission may have patched
        # (an import looks __import__ up in the builtins, not in the namespace a submission can bind names in)
        serve = f"import runpy as _aiayn_\n_aiayn_.run_path({kernel.__file__!r})['serve']({data!r})\ndel _aiayn_"
        self._call_timeout = request["seconds"] + self.interrupt_grace
        try:
            probe = self.execute_cell(nbformat.v4.new_code_cell(serve), index, store_history=False)
        except DeadKernelError:
            raise StuckCell(_ended(self.km)) from None
        finally:
            self._call_timeout = None
        try:
            if any(o.get("ename") in ("CellTimeoutError", "KeyboardInterrupt") for o in probe.outputs):
                return {**kernel.NO_ANSWER, "timeout": True}
            return read_answer(path, [d[-64:] for o in probe.outputs for d in DIGESTS.findall(o.get("text", ""))])
        finally:
            Path(path).unlink(missing_ok=True)

    def on_cell_executed(self, **kwargs):
        if not kwargs["execute_reply"]["content"].pop("aiayn_timeout", False):  # not the grader's own timeout
            _renamed(kwargs["execute_reply"]["content"])
        return super().on_cell_executed(**kwargs)

    def output(self, outs, msg, display_id, cell_index):
        """Keep a cell's output within ``cell_output`` characters and a notebook's within ``notebook_output``."""
        content = msg.get("content", {})
        digests = DIGESTS.findall(str(content.get("text", "")))  # (a stream's)
        if digests and self._call_timeout and sum(kernel.DIGEST in o.get("text", "") for o in outs) < 2:
            content["text"] = "\n".join(digests[:2])  # a call's answer: past the limits, and only that
            return super().output(outs, msg, display_id, cell_index)
        if msg["msg_type"] == "error":  # always kept (it takes a graded cell's points), within the limit
            _renamed(content)
            content["evalue"] = str(content.get("evalue", ""))[:2000]
            content["traceback"] = [line[:2000] for line in content["traceback"][-20:]]
            return super().output(outs, msg, display_id, cell_index)
        size = len(json.dumps(content, default=str))
        meta = self.nb.cells[cell_index].metadata.get("nbgrader", {})
        book = meta.get("locked") and not meta.get("grade")  # the book's cell: figures of twice the limit, apart
        cell, total = self._out.get(cell_index, 0), self._out.get("total", 0) * (not book)
        limits = [("cell's", self.cell_output * (1 + bool(book)), cell), ("notebook's", self.notebook_output, total)]
        if over := [(name, chars) for name, chars, used in limits if used + size > chars]:
            if ("cut", cell_index) not in self._out:
                self._out[("cut", cell_index)] = cut = f"{over[0][0]} limit of {over[0][1]:,} characters"
                outs.append(nbformat.v4.new_output("stream", name="stdout", text=f"\n[output cut: past the {cut}]\n"))
            return None
        self._out[cell_index], self._out["total"] = cell + size, self._out.get("total", 0) + size * (not book)
        return super().output(outs, msg, display_id, cell_index)

    async def async_execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
        """nbclient's, but a cell whose output never arrives (a message over the size limit, refused, breaks the
        connection it came by) fails with a note, and the cells after it get a new connection."""
        try:
            cell = await super().async_execute_cell(cell, cell_index, execution_count, store_history)
            if self.km.over_disk():  # this cell wrote past the limit: it is skipped, not the next
                self.km.provisioner.process.kill()
                raise DeadKernelError("the kernel wrote more to disk than its limit")
            return cell
        except CellTimeoutError as err:
            if "IOPub" not in str(err):
                raise
            self.kc._iopub_channel = self.kc.iopub_channel.close()  # closed, and forgotten (close returns None):
            self.kc.iopub_channel  # noqa: B018 (read, it makes a new connection, whose subscription reaches the kernel)
            await asyncio.sleep(0.5)
            cell.outputs.append(_error_output("OutputLost", LOST))
            return cell

    execute_cell = run_sync(async_execute_cell)

    async def _async_handle_timeout(self, timeout, cell=None):
        self.log.error("cell %s: no reply within %s s; interrupting the kernel", self._cell, timeout)
        await ensure_async(self.km.interrupt_kernel())
        try:
            await ensure_async(self.kc.shell_channel.get_msg(timeout=self.interrupt_grace))
        except Empty:
            raise StuckCell(
                f"was stopped: it ran past its time limit ({timeout:g} s) and did not stop when interrupted "
                f"within {self.interrupt_grace:g} s (a long call into C code, or code that ignores interrupts)"
            ) from None
        return {"content": {**self.error_on_timeout, "status": "error", "aiayn_timeout": True}}


def read_answer(path: str, digests: list[str]) -> dict:
    """The answer file that a kernel wrote, as data, if the call printed one SHA-256 (``digests``), the file's: never a
    link put in its place (nor a pipe), no file over ``MAX_FILE`` bytes, nothing to inflate, no structure over
    ``MAX_PICKLE`` bytes and no more than ``MAX_ELEMENTS`` items read."""
    import torch

    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as file:
            file = io.BytesIO(file.read(MAX_FILE + 1))
        if digests != [hashlib.sha256(file.getvalue()).hexdigest()]:  # (none, several, or not the file's)
            why = "the answer file is not the one the call wrote (code that ran after the call changed it?)"
            return {**kernel.NO_ANSWER, "error": ("AnswerChanged", why)}
        with zipfile.ZipFile(file) as archive:  # stored, as torch.save writes it
            assert all(entry.compress_type == zipfile.ZIP_STORED for entry in archive.infolist())
            if sum(e.file_size for e in archive.infolist() if e.filename.endswith(".pkl")) > MAX_PICKLE:
                return {**kernel.NO_ANSWER, "error": ("TooLarge", f"a result of over {MAX_PICKLE:,} bytes")}
        file.seek(0)
        answer = torch.load(file, weights_only=True)
        assert set(kernel.NO_ANSWER) <= set(answer) and isinstance(answer["calls"], list)
        if _numbers(answer["value"]) > kernel.MAX_ELEMENTS:
            return {**kernel.NO_ANSWER, "error": ("TooLarge", f"a result of over {kernel.MAX_ELEMENTS:,} items")}
        return answer
    except Exception:  # no answer, or one that is not data
        return {**kernel.NO_ANSWER, "error": ("NoResult", "the kernel sent back no result the checks can read")}


def _numbers(value) -> int:
    """How many items a result holds at every level (a tensor's elements, the items of each list, tuple and dict, a
    row shared by many rows counted each time), counted no further than past ``kernel.MAX_ELEMENTS``."""
    import torch

    count, todo = 0, [value]
    while todo and count <= kernel.MAX_ELEMENTS:
        x = todo.pop()
        count += x.numel() if isinstance(x, torch.Tensor) else len(x) if isinstance(x, (list, tuple, dict)) else 1
        todo += list(x.values() if isinstance(x, dict) else x) if isinstance(x, (list, tuple, dict)) else []
    return count


def _ended(manager) -> str:
    why = ": it wrote more to disk than its limit" if manager.disk_full else " (out of memory, killed or exited)"
    return f"ended its kernel{why}"


GRADER_ERRORS = {"CellTimeoutError", "CellStopped", "Failed", "NotebookTimeLimit", "OutputLost"}  # what report reads


def _renamed(content: dict) -> None:
    """An exception of the submission's own under a name of the grader's errors: renamed, so that the report cannot
    take it for the grader's."""
    if str(content.get("ename")).startswith((*GRADER_ERRORS, "stopped")):  # as the report reads them
        content["ename"] = f"(the submission's) {content['ename']}"


def _error_output(ename: str, message: str) -> dict:
    return nbformat.v4.new_output("error", ename=ename, evalue=message, traceback=[f"{ename}: {message}"])


# ----------------------------------------------------------------------------------------------------------
# After nbgrader autograde: a line per submission
# ----------------------------------------------------------------------------------------------------------


INDENT = {"initial_indent": " " * 16, "subsequent_indent": " " * 18}  # a submission's lines under its points
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")  # shown as "?"


def _error(cell) -> str:
    """The error a cell of an autograded notebook ended with: "timed out", "stopped: why", its message, or "" (a
    KeyboardInterrupt only when the cell raised nothing else: the grader's interrupt comes with its timeout)."""
    errors = [out for out in cell.get("outputs", []) if out.get("output_type") == "error"]
    for out in sorted(errors, key=lambda out: out.get("ename") == "KeyboardInterrupt"):
        name, lines = out.get("ename"), str(out.get("evalue", "")).strip().splitlines() or [""]
        names = {"CellTimeoutError": "timed out", "CellStopped": f"stopped: {lines[0]}", "Failed": lines[0]}
        return names.get(name, f"{name}: {lines[0]}")
    return ""


def _cell_lines(nb) -> list[str]:
    """The report's lines about one graded notebook: changes to its nbgrader cells, stops, cut output, failed checks
    and flags."""
    lines, failed, flags, stopped = list(nb.metadata.get("aiayn", {}).get("notes", [])), [], {}, False
    for i, cell in enumerate(nb.cells):
        meta, mine, error = cell.metadata.get("nbgrader", {}), cell.metadata.get("aiayn", {}), _error(cell)
        for flag in mine.get("check", {}).get("flags", []) + mine.get("flags", []):
            flags.setdefault(flag, []).append(meta.get("grade_id", f"cell {i}"))
        if mine.get("stopped"):
            lines.append(f"cell {i} {mine['stopped']}; run again one statement at a time")
        if error == "timed out":
            lines.append(f"cell {i} stopped by the time limit; the cells after it ran")
        elif error.startswith("stopped: "):
            lines.append(error.removeprefix("stopped: ") + "; graded again without it")
        elif error.startswith("NotebookTimeLimit") and not stopped:
            stopped = True
            lines.append(f"cell {i} and the cells after it {error.split(': ', 1)[1]}")
        lines += [f"cell {i}: {error.partition(': ')[2]}"] * error.startswith("OutputLost")
        lines += [f"cell {i}: its output was cut at the {mine.get('cut')}"] * bool(mine.get("cut"))
        if error and not error.startswith("stopped: ") and meta.get("grade"):
            failed.append((meta["grade_id"], error))
    if len(failed) > 2 and len({e for _, e in failed}) == 1:
        lines.append(f"{len(failed)} graded cells failed: {failed[0][1]}")
    else:
        lines += [f"{key}: {error}" for key, error in failed]
    return lines + [f"FLAG {flag} ({', '.join(where)}): read this submission" for flag, where in flags.items()]


def _not_graded(submitted: Path) -> str:
    """Why a submission has no graded notebook."""
    if problems := odd_files(submitted.parent, submitted.parents[2]):
        return problems[0]
    try:
        nbformat.read(submitted, as_version=4)
    except FileNotFoundError:
        return "nothing submitted"
    except Exception as err:  # why nbgrader could not grade it
        return f"{type(err).__name__}: {str(err).strip().splitlines()[0]}"[:80]
    return "see nbgrader autograde's log"


def _beside(folder: Path, release: Path) -> list[str]:
    """Flags on the files of a submission's folder: those beside its notebooks that the released assignment lacks
    (code or data that no flag reads), and hard links (shared with another submission: the others are refused)."""
    found = [(name, links) for kind, links, *_, name in _listing(folder) if kind == "f"]
    extra = [name for name, _ in found if not name.endswith(".ipynb") and not (release / name).is_file()]
    shared = [name for name, links in found if links > 1]
    flags = [f"files beside the notebook ({', '.join(extra[:5])}): read them"] * bool(extra)
    return flags + [f"{', '.join(shared[:5])}: a hard link, shared with another submission"] * bool(shared)


def report(root: Path, assignment: str) -> list[str]:
    """After ``nbgrader autograde``: a line per submission of ``assignment`` in the course at ``root`` with its points,
    then a line for each graded cell that lost its points (and why), each cell stopped by the time limit, each change
    the grader made to the submission's nbgrader metadata, and the reason a submission could not be graded."""

    root, lines = Path(root).resolve(), []
    if not (root / "gradebook.db").exists() or not (root / "submitted").is_dir():
        why = f"run `nbgrader autograde {assignment}` there first, the submissions in submitted/<student>/{assignment}/"
        raise FileNotFoundError(f"no gradebook.db or no submitted/ in {root}: {why}")
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        try:
            a = gb.find_assignment(assignment)
        except MissingEntry:
            names = ", ".join(x.name for x in gb.assignments) or "none"
            raise ValueError(f"the gradebook has no assignment {assignment!r}; it has {names}") from None
        students = sorted(p.name for p in (root / "submitted").iterdir() if (p / assignment).is_dir())
        width, release = max([14] + list(map(len, students))), root / "release" / assignment  # points in one column
        for student in students:
            for name in sorted(nb.name for nb in a.notebooks):
                graded = root / "autograded" / student / assignment / f"{name}.ipynb"
                if not graded.exists():
                    why = _not_graded(root / "submitted" / student / assignment / f"{name}.ipynb")
                    lines.append(f"{student:{width}} {'-':>5} / {a.max_score:g}  not graded: {why}")
                    continue
                score = 0.0
                with contextlib.suppress(MissingEntry):
                    score = gb.find_submission_notebook(name, assignment, student).score
                details = _cell_lines(nbformat.read(graded, as_version=4))
                details += [f"FLAG {x}" for x in _beside(root / "submitted" / student / assignment, release)]
                lines.append(f"{student:{width}} {score:5g} / {a.max_score:g}")
                lines += [y for x in details for y in textwrap.wrap(" ".join(x.split()), 79, **INDENT)]  # (no gaps)
    # no terminal escapes, and no line break in a name (a student's folder, a file's): each line one of the report's
    return [CONTROL.sub("?", x).encode(errors="backslashreplace").decode() for x in lines]
