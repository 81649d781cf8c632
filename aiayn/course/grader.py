"""nbgrader plug-ins for the book's courses, named in the ``nbgrader_config.py`` that ``python -m aiayn.course course``
writes:

- ``RestoreCells``: before nbgrader's own OverwriteCells, every cell of a submission gets its nbgrader metadata from
  the gradebook (the instructor's source notebook), never from the submission;
- ``Execute``: nbgrader's Execute with each kernel in a sandbox (``SandboxKernelManager``), the checks sent with each
  check cell, points from the checks' own records, and cells that cannot be stopped skipped in a second run."""

import copy
import importlib.util
import re
import runpy
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from queue import Empty

import nbformat
import nbgrader.preprocessors
from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import ensure_async
from nbclient.exceptions import DeadKernelError
from nbgrader.api import Gradebook
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Bool, Float, Integer


def instructor_cells(gb, notebook: str, assignment: str) -> dict:
    """What the gradebook holds of the instructor's copy of a notebook: its cells, points and solution cells."""
    source = gb.find_notebook(notebook, assignment)
    return {
        "cells": [(c.name, c.cell_type, c.locked, c.source) for c in source.source_cells],
        "points": {c.name: c.max_score for c in source.grade_cells},
        "solutions": {c.name for c in source.solution_cells},
    }


def restore(nb, instructor: dict) -> list[str]:
    """Make a submission's nbgrader cells those of the instructor's copy (in place); return a line for each kind of
    change:

    - a cell whose grade id the instructor's copy does not have (a graded cell a student added), or a second copy of
      a cell, becomes an ordinary cell;
    - a known cell gets the instructor's metadata (points, locked, solution), whatever the submission says;
    - a cell without metadata (a notebook copied into a new one, or whose metadata was stripped) whose source is that
      of a read-only or graded cell is recognised by its source;
    - a graded cell missing from the submission is appended at the end, where every function the student wrote
      exists. nbgrader's OverwriteCells then restores the source of read-only and graded cells from the gradebook.
    """
    cells, points, solutions = instructor["cells"], instructor["points"], instructor["solutions"]
    known = {name: (cell_type, locked) for name, cell_type, locked, _ in cells}
    by_source = {src.strip(): name for name, _, locked, src in cells if locked and src.strip()}

    def metadata(name):
        meta = {
            "grade": name in points,
            "grade_id": name,
            "locked": known[name][1],
            "schema_version": 3,
            "solution": name in solutions,
        }
        if name in points:
            meta["points"] = points[name]
        return meta

    present, dropped = {}, []  # grade id -> cell
    for cell in nb.cells:
        name = cell.metadata.get("nbgrader", {}).get("grade_id")
        if name is None:
            cell.metadata.pop("nbgrader", None)
            continue
        if name not in known or name in present:  # a cell the assignment does not have, or a second copy
            dropped.append(name)
            del cell.metadata["nbgrader"]
        else:
            present[name] = cell
    recognised = 0
    for cell in nb.cells:
        name = by_source.get(cell.source.strip())
        if "nbgrader" not in cell.metadata and name is not None and name not in present:
            present[name] = cell
            recognised += 1
    changed = []
    for name, cell in present.items():
        old = {k: v for k, v in cell.metadata.get("nbgrader", {}).items() if k not in ("checksum", "cell_type")}
        if old and old != metadata(name):
            changed.append(name)
        cell.metadata["nbgrader"] = metadata(name)
    sources = {name: src for name, _, _, src in cells}
    edited = [name for name, cell in present.items() if known[name][1] and cell.source.strip() != sources[name].strip()]
    missing = [name for name in points if name not in present]
    for name in missing:
        src = next(s for n, _, _, s in cells if n == name)
        new = nbformat.v4.new_code_cell(src) if known[name][0] == "code" else nbformat.v4.new_markdown_cell(src)
        new.metadata["nbgrader"] = metadata(name)
        nb.cells.append(new)

    return _notes(dropped, changed, edited, recognised, missing)


def _notes(dropped: list, changed: list, edited: list, recognised: int, missing: list) -> list[str]:
    """restore's report: a line for each kind of change it made."""
    notes = []
    if dropped:
        notes.append(
            f"{len(dropped)} cell(s) marked as nbgrader cells that the assignment does not have, or copies "
            f"({', '.join(dropped)}): run as ordinary cells"
        )
    if changed:
        notes.append(
            f"{len(changed)} cell(s) whose nbgrader metadata (points, read-only, graded) differ from the "
            f"instructor's copy ({', '.join(changed)}): restored"
        )
    if edited:
        notes.append(
            f"{len(edited)} read-only or graded cell(s) edited ({', '.join(edited)}): the instructor's source "
            f"runs instead"
        )
    if recognised:
        notes.append(f"{recognised} cell(s) without nbgrader metadata recognised by their source")
    if missing:
        notes.append(
            f"{len(missing)} graded cell(s) missing from the submission ({', '.join(missing)}): appended at the end"
        )
    return notes


class RestoreCells(NbGraderPreprocessor):
    """Before nbgrader's OverwriteCells: a submission's nbgrader cells become those of the instructor's copy
    (``restore``), and nbgrader's log gets a line for each kind of change."""

    def preprocess(self, nb, resources):
        info = resources["nbgrader"]
        with Gradebook(info["db_url"]) as gb:
            instructor = instructor_cells(gb, info["notebook"], info["assignment"])
        for note in restore(nb, instructor):
            self.log.warning("%s/%s: %s", info["student"], info["assignment"], note)
        return nb, resources


# ----------------------------------------------------------------------------------------------------------
# The kernel of a submission: in a sandbox, and graded by the checks' own results
# ----------------------------------------------------------------------------------------------------------

_CHECK_CALL = re.compile(r'\["check"\]\(\s*"(\w+)", "(\w+)", globals\(\)\)\s*$')


def sandbox_problem() -> str:
    """Why a sandboxed kernel cannot start on this machine ("" when it can)."""
    if shutil.which("bwrap") is None:
        return (
            "bubblewrap is not installed (Debian, Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap)"
        )
    run = subprocess.run(
        ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        + ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--", "true"],
        capture_output=True,
        text=True,
    )
    if run.returncode:
        return f"bubblewrap cannot create a sandbox here ({run.stderr.strip() or run.returncode}): user namespaces off?"
    return ""


def _hidden() -> list[Path]:
    """What a submission's kernel must not read: the checks (their reference values and solutions) and, in a clone
    of the book, the chapters and course notebooks, which hold the exercises' solutions."""
    spec = importlib.util.find_spec("aiayn.checks")
    checks = Path(spec.origin)
    hidden = [checks, *checks.parent.glob("__pycache__/checks.*.pyc")]
    root = checks.parent.parent
    hidden += [root / name for name in ("book", "course", ".git", "_build") if (root / name).is_dir()]
    return hidden


class SandboxKernelManager(AsyncKernelManager):
    """A kernel in a bubblewrap sandbox: the file system read-only; the course folder (gradebook, source notebooks,
    other submissions), the checks and the book's solutions hidden; no network; a fresh writable copy of the
    submission's folder as its working directory; talking to the grader over Unix sockets in a folder of its own."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.sandbox_dir = Path(tempfile.mkdtemp(prefix="aiayn-kernel-"))
        self.transport = "ipc"
        self.connection_file = str(self.sandbox_dir / "kernel.json")
        self.ip = str(self.sandbox_dir / "kernel-ipc")

    def format_kernel_cmd(self, extra_arguments=None) -> list[str]:
        self.kernel_spec.interrupt_mode = "message"  # a signal to the sandbox would not reach the kernel inside it
        cmd = super().format_kernel_cmd(extra_arguments)
        cwd = Path(self._launch_args.get("cwd") or Path.cwd()).resolve()
        course = cwd.parents[2] if len(cwd.parents) > 2 and cwd.parents[1].name == "autograded" else None
        if course is None and (Path.cwd() / "gradebook.db").exists():
            course = Path.cwd().resolve()  # nbgrader run in the course folder, with submissions kept elsewhere
        work, home = self.sandbox_dir / "work", self.sandbox_dir / "home"
        if not work.exists():
            shutil.copytree(cwd, work, ignore=shutil.ignore_patterns("*.ipynb"))
        home.mkdir(exist_ok=True)
        from aiayn import ROOT, data, pretrained

        caches = [data.cache_dir(), pretrained.cache_dir()]
        box = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        # what the kernel needs (Python, the package, the caches), even where it lies in /tmp
        for keep in sorted({Path(sys.prefix), Path(sys.base_prefix), ROOT, *caches}, key=lambda p: len(str(p))):
            if keep.resolve().is_relative_to("/tmp") and keep.is_dir():
                box += ["--ro-bind", str(keep.resolve()), str(keep)]
        if course is not None:
            box += ["--tmpfs", str(course)]
        for path in _hidden():
            box += ["--tmpfs", str(path)] if path.is_dir() else ["--ro-bind", "/dev/null", str(path)]
        for cache in caches:
            if cache.is_dir():  # seen even where it lies in a hidden folder (such as _build)
                box += ["--ro-bind", str(cache.resolve()), str(cache)]
        box += ["--bind", str(self.sandbox_dir), str(self.sandbox_dir), "--bind", str(work), str(cwd)]
        env = {"HOME": home, "MPLCONFIGDIR": home, "IPYTHONDIR": home}
        env |= {"AIAYN_DATA": caches[0], "AIAYN_PRETRAINED": caches[1]}  # read-only
        for name, value in env.items():
            box += ["--setenv", name, str(value)]
        box += ["--unsetenv", "JPY_PARENT_PID"]  # the kernel's parent is the sandbox: bubblewrap ends it with us
        box += ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--die-with-parent", "--chdir", str(cwd), "--"]
        return box + cmd

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart)
        if not restart:
            shutil.rmtree(self.sandbox_dir, ignore_errors=True)


class StuckCell(Exception):
    """A cell that went on past its time limit and an interrupt: its kernel is killed, and the notebook graded
    again with the cell skipped."""


class Execute(nbgrader.preprocessors.Execute):
    """nbgrader's Execute, for the book's checks:

    - the kernel runs in a sandbox (``SandboxKernelManager``) unless ``sandbox`` is off;
    - a check cell runs the checks sent with it (the kernel cannot read them beforehand), with a fresh nonce and
      the grader's record of the tools the checks use; its points come from the record the check emits, never from
      what else the cell shows;
    - a cell that does not stop when interrupted after its time limit (a long call into C, a cell that ignores
      SIGINT), or that kills its kernel, is skipped: the notebook is graded again without it, and the cell says so.
    """

    sandbox = Bool(True, help="run each submission's kernel in a bubblewrap sandbox").tag(config=True)
    interrupt_grace = Float(5.0, help="seconds a cell may take to stop after an interrupt").tag(config=True)
    max_stuck = Integer(3, help="cells skipped at most before a notebook is not graded").tag(config=True)
    _checks = None  # what _checks_source returns, read once

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.sandbox:
            self.kernel_manager_class = SandboxKernelManager

    def preprocess(self, nb, resources=None, km=None):
        skipped: dict[int, tuple[str, str]] = {}  # cell -> ("stuck" or "died", why)
        self._checks = _checks_source() if self._checks is None else self._checks
        while True:
            work = copy.deepcopy(nb)
            for index in skipped:
                work.cells[index].source = "raise RuntimeError('skipped: this cell was stopped')"
            try:
                self._index = None
                work, resources = super().preprocess(work, resources, km)
                break
            except (StuckCell, DeadKernelError) as err:
                if self._index is None or len(skipped) >= self.max_stuck:
                    raise
                stuck = isinstance(err, StuckCell)
                skipped[self._index] = ("stuck", str(err)) if stuck else ("died", "ended its kernel (killed or exited)")
                self.log.warning("cell %d %s; grading again without it", self._index, skipped[self._index][1])
        for index, (kind, why) in skipped.items():
            cell = work.cells[index]
            cell.source = nb.cells[index].source
            message = f"cell {index} {why}; the notebook was graded again without it, so the cells after it ran"
            cell.outputs = [_error_output("CellStopped", message)]
            cell.metadata.setdefault("aiayn", {})["stopped"] = kind
        return work, resources

    def preprocess_cell(self, cell, resources, index):
        self._index = index
        meta = cell.metadata.get("nbgrader", {})
        call = _CHECK_CALL.search(cell.source) if cell.cell_type == "code" and meta.get("grade") else None
        if call is None:
            cell, resources = super().preprocess_cell(cell, resources, index)
            if meta.get("grade"):
                _no_partial_credit(cell)
            return cell, resources
        nonce = secrets.token_hex(16)
        shown = cell.source
        cell.source = _graded_check_cell(self._checks, call[1], call[2], nonce)
        try:
            self._check_assign_resources(resources)
            cell = self.execute_cell(cell, index, store_history=False)
        finally:
            cell.source = shown
        _grade_from_record(cell, nonce, self._checks[2])
        return cell, self.resources

    async def _async_handle_timeout(self, timeout, cell=None):
        self.log.error("cell %s: no reply within %s s; interrupting the kernel", self._index, timeout)
        await ensure_async(self.km.interrupt_kernel())
        try:
            await ensure_async(self.kc.shell_channel.get_msg(timeout=self.interrupt_grace))
        except Empty:
            self.shutdown_kernel = "immediate"
            raise StuckCell(
                f"was stopped: it ran past its time limit ({timeout:g} s) and did not stop when interrupted "
                f"within {self.interrupt_grace:g} s (a long call into C code, or a cell that ignores interrupts)"
            ) from None
        return {"content": {**self.error_on_timeout, "status": "error"}}


def _checks_source() -> tuple[str, dict, str]:
    """The checks' source, the record of their tools taken in this (the grader's) process, and the MIME type of
    the record a graded check emits."""
    path = importlib.util.find_spec("aiayn.checks").origin
    checks = runpy.run_path(path)
    return Path(path).read_text(encoding="utf-8"), checks["tools"](), checks["CHECK_MIME"]


def _graded_check_cell(checks: tuple[str, dict, str], assignment: str, key: str, nonce: str) -> str:
    """What a check cell runs under the grader: the checks travel in the cell (the kernel cannot read them before,
    and the cell leaves no copy in the input history or linecache), and run only if ``exec``, ``compile`` and
    ``globals`` are the interpreter's own."""
    source, tools, _ = checks
    grading = {"nonce": nonce, "tools": tools}
    return (
        "__import__('linecache').cache.pop(__import__('sys')._getframe().f_code.co_filename, None)\n"
        "for __n, __f in (('exec', exec), ('compile', compile), ('globals', globals)):\n"
        "    if (__f.__class__ is not [].append.__class__ or __f.__name__ != __n\n"
        "            or __f.__self__.__name__ != 'builtins'):\n"
        "        raise RuntimeError('the grader cannot run this check: ' + __n + ' was replaced')\n"
        "__ns = {'__name__': 'aiayn.checks', '__builtins__': exec.__self__}\n"
        "try:\n"
        f"    exec(compile({source!r}, '<aiayn.checks>', 'exec'), __ns)\n"
        f"    __ns['check']({assignment!r}, {key!r}, globals(), {grading!r})\n"
        "finally:\n"
        "    del __ns, __n, __f\n"
    )


def _error_output(ename: str, message: str) -> dict:
    return nbformat.v4.new_output("error", ename=ename, evalue=message, traceback=[f"{ename}: {message}"])


def _no_partial_credit(cell) -> None:
    """A graded cell's displayed values are shown, never read as points (nbgrader reads a cell's first result as
    partial credit, and any result that is not a number as full marks)."""
    for i, out in enumerate(cell.outputs):
        if out.output_type == "execute_result":
            cell.outputs[i] = nbformat.v4.new_output("display_data", data=out.data, metadata=out.get("metadata", {}))


def _grade_from_record(cell, nonce: str, mime: str) -> None:
    """A check cell's points come from the record (of type ``mime``) its check emitted with this cell's nonce: its
    outputs become what the check printed and displayed, and one error when the check failed or left no record (0
    points)."""
    record, kept, errors = None, [], []
    for out in cell.outputs:
        data = out.get("data", {})
        if mime in data:
            record = data[mime] if data[mime].get("nonce") == nonce else record
        elif out.output_type == "error":
            errors.append(out)
        elif out.output_type == "stream":
            kept.append(nbformat.v4.new_output("stream", name="stdout", text=out.text))
        else:
            kept.append(out)
    cell.outputs = kept
    _no_partial_credit(cell)
    if record is None and errors and errors[0].ename in ("CellTimeoutError", "KeyboardInterrupt"):
        record = {"passed": False, "message": "timed out", "flags": []}
    elif record is None:
        why = (
            f"{errors[0].ename}: {str(errors[0].evalue).strip()[:300]}"
            if errors
            else "the cell was changed while it ran (nothing of the check's ran)"
        )
        record = {"passed": False, "message": f"the check left no result: {why}", "flags": ["no check result"]}
    elif errors and record["passed"]:
        record = {**record, "passed": False, "message": "the cell raised after its check passed"}
    cell.metadata["aiayn"] = {"check": {k: record.get(k) for k in ("passed", "message", "flags")}}
    if not record["passed"]:
        cell.outputs.append(_error_output("Failed", record["message"] or "failed"))
