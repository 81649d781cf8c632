"""nbgrader's configuration for a course of the book's exercises: `python -m aiayn.course course` copies it into a
new course folder, where the instructor may change it."""

import os
import warnings

from nbconvert.preprocessors import ClearMetadataPreprocessor
from sqlalchemy.exc import SAWarning

from nbgrader import preprocessors as nb

from aiayn.course.grader import Execute, RestoreCells, refuse_odd_submissions

c = get_config()  # noqa: F821

# Time limits in seconds. A cell that runs longer is interrupted and marked with an error; the cells after it still
# run. A statement that does not stop when interrupted (a long call into C code), or that ends its kernel, is skipped
# alone: the notebook is graded again without it, so the statements before and after it count.
STUDENT_CELL = 30  # a cell the student writes
BOOK_CELL = 600  # the book's own (read-only) cells, which train small models in some chapters
CHECK_CALL = 10  # one call of the student's function by a check
NOTEBOOK = 1800  # a whole notebook, all its runs together; the cells after it are not run

# Limits of each submission's kernel, and of what its output may cost the grader.
MEMORY_MB = 4096  # address space of the kernel
PROCESSES = 64  # processes and threads of the kernel
DISK_MB = 512  # what the kernel may write to disk (10,000 files and folders at most), checked twice a second, each cell
CELL_OUTPUT = 1_000_000  # characters of output kept per cell (a sharp two-panel figure fits); the rest is cut
NOTEBOOK_OUTPUT = 4_000_000  # characters of output kept per notebook (of the student's cells: not the book's figures)

# Each submission's kernel runs in a bubblewrap sandbox as an unprivileged user: it sees the Python environment, the
# book's package without its course code, the data and the book's models and results, all read-only, and a copy of
# its own submission; no course folder, gradebook, solutions or network. Set this to False only to try the course on
# a machine without bubblewrap, never to grade a class.
SANDBOX = True


def cell_timeout(cell):  # the book's own cells are read-only and neither graded nor a solution
    meta = cell.metadata.get("nbgrader", {})
    return BOOK_CELL if meta.get("locked") and not meta.get("grade") and not meta.get("solution") else STUDENT_CELL


c.Execute.update(timeout_func=cell_timeout, interrupt_on_timeout=True, notebook_seconds=NOTEBOOK)
c.Execute.update(cell_output=CELL_OUTPUT, notebook_output=NOTEBOOK_OUTPUT)
c.SandboxKernelManager.update(sandbox=SANDBOX, memory_mb=MEMORY_MB, processes=PROCESSES, disk_mb=DISK_MB)
c.Execute.shutdown_kernel = "immediate"  # killed when done, not asked to stop and awaited: its folder goes with it
c.Execute.extra_arguments = ["--IPKernelApp.log_level=ERROR", "--HistoryManager.hist_file=:memory:"]
c.Execute.extra_arguments += ["--InteractiveShell.automagic=False"]  # `run f.py` is not %run (the flags read Python)
os.environ["AIAYN_CHECK_SECONDS"] = str(CHECK_CALL)
warnings.filterwarnings("ignore", category=SAWarning)  # nbgrader 0.9's gradebook session warns on every autograde

# A submission holding a symbolic link, a hard link or a device file is not graded, and nothing of it is read. Every
# nbgrader cell of a submission takes its metadata (points, read-only, graded) from the gradebook; nbgrader's
# OverwriteCells then restores the read-only and graded cells' source. The book's Execute runs each check in this
# process, on the student's results sent back from the kernel as data.
refuse_odd_submissions()
# fmt: off
c.Autograde.sanitize_preprocessors = [nb.ClearOutput, nb.DeduplicateIds, nb.OverwriteKernelspec, RestoreCells,
                                      nb.OverwriteCells, nb.CheckCellMetadata]
c.Autograde.autograde_preprocessors = [Execute, nb.IgnorePattern, ClearMetadataPreprocessor, nb.LimitOutput,
                                       nb.SaveAutoGrades, nb.AssignLatePenalties, nb.CheckCellMetadata]
# fmt: on
c.ClearMetadataPreprocessor.preserve_cell_metadata_mask = [("nbgrader",), ("aiayn",)]
c.ClearMetadataPreprocessor.preserve_nb_metadata_mask = [("language_info", "name"), ("aiayn",)]
