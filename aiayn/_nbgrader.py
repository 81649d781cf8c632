"""An nbgrader plug-in for the book's courses, named in the ``nbgrader_config.py`` that ``python -m aiayn.course
course`` writes: before nbgrader's own OverwriteCells, every cell of a submission gets its nbgrader metadata from the
gradebook (the instructor's source notebook), never from the submission."""

import nbformat
from nbgrader.api import Gradebook
from nbgrader.preprocessors import NbGraderPreprocessor


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
