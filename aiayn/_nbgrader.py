"""An nbgrader plug-in for the book's courses, named in the ``nbgrader_config.py`` that ``python -m aiayn.course
course`` writes: before nbgrader's own OverwriteCells, every cell of a submission gets its nbgrader metadata from the
gradebook (the instructor's source notebook), never from the submission."""
import nbformat
from nbgrader.api import Gradebook
from nbgrader.preprocessors import NbGraderPreprocessor


class RestoreCells(NbGraderPreprocessor):
    """Make a submission's nbgrader cells those of the instructor's copy, and log a line for each change:

    - a cell whose grade id the gradebook does not know (a graded cell a student added) becomes an ordinary cell;
    - a known cell gets the gradebook's metadata (points, locked, solution), whatever the submission says;
    - a cell without metadata (a notebook copied into a new one, or whose metadata was stripped) whose source is that
      of a read-only or graded cell is recognised by its source;
    - a graded cell missing from the submission is appended at the end, where every function the student wrote
      exists. nbgrader's OverwriteCells then restores the source of read-only and graded cells from the gradebook.
    """

    def preprocess(self, nb, resources):
        info = resources["nbgrader"]
        who = f"{info['student']}/{info['assignment']}"
        with Gradebook(info["db_url"]) as gb:
            source = gb.find_notebook(info["notebook"], info["assignment"])
            cells = [(c.name, c.cell_type, c.locked, c.source) for c in source.source_cells]
            points = {c.name: c.max_score for c in source.grade_cells}
            solutions = {c.name for c in source.solution_cells}
        known = {name: (cell_type, locked) for name, cell_type, locked, _ in cells}
        by_source = {src.strip(): name for name, _, locked, src in cells if locked and src.strip()}

        def metadata(name):
            meta = {"grade": name in points, "grade_id": name, "locked": known[name][1],
                    "schema_version": 3, "solution": name in solutions}
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
        missing = [name for name in points if name not in present]
        for name in missing:
            src = next(s for n, _, _, s in cells if n == name)
            new = nbformat.v4.new_code_cell(src) if known[name][0] == "code" else nbformat.v4.new_markdown_cell(src)
            new.metadata["nbgrader"] = metadata(name)
            nb.cells.append(new)

        if dropped:
            self.log.warning("%s: %d cell(s) marked as nbgrader cells that the assignment does not have, or "
                             "copies (%s): run as ordinary cells", who, len(dropped), ", ".join(dropped))
        if changed:
            self.log.warning("%s: %d cell(s) whose nbgrader metadata (points, read-only, graded) differ from the "
                             "instructor's copy (%s): restored", who, len(changed), ", ".join(changed))
        if recognised:
            self.log.warning("%s: %d cell(s) without nbgrader metadata recognised by their source", who, recognised)
        if missing:
            self.log.warning("%s: %d graded cell(s) missing from the submission (%s): appended at the end", who,
                             len(missing), ", ".join(missing))
        return nb, resources
