"""The course: the book's coding exercises as nbgrader assignments, graded where no submission can reach the verdict.

    assignments  the exercises (found from nbgrader's solution markers), the course folder, the report; the command
                 line is ``python -m aiayn.course`` (``__main__``)
    checks       the checks and their reference implementations: run only in the grader's process (or in a student's
                 own run of a clone), never in a graded kernel
    grader       nbgrader's plug-ins: each kernel in a sandbox that holds as root, each check in the grader's process
    kernel       a module a graded kernel can import: it calls the student's function and answers as data
    inputs       the other one: the checks' inputs that are not plain tensors (a stand-in model, recording optimizers)
    nbgrader_config.py  the configuration a new course starts with

None of it is about the paper: the exercises live in the chapters (book/) and course/. This package is not part of
the installed wheel (pyproject.toml lists only what readers import), so no right answer ships with ``pip install``.
"""
