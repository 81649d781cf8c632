"""Sphinx extension: the references page labels each entry as the text cites it, "Vaswani et al., 2017".

The chapters cite author-year (``bibtex_reference_style: author_year``), but pybtex's default labels are
alphabetic ("VSP+17"), so a reader could not match a citation to its entry. This registers the pybtex style
``author_year_labels``: the "plain" bibliography style (sorted by author, year, title) with labels made like
the citations: one author "Last", two "Last and Last", three or more "Last et al.", then ", year".
"""
from pybtex.plugin import register_plugin
from pybtex.richtext import Text
from pybtex.style.formatting.plain import Style as PlainStyle
from pybtex.style.labels import BaseLabelStyle


def _last(person) -> str:
    return Text.from_latex(" ".join(person.prelast_names + person.last_names)).render_as("text")


class AuthorYearLabels(BaseLabelStyle):
    def format_labels(self, sorted_entries):
        seen = {}
        for entry in sorted_entries:
            persons = entry.persons.get("author") or entry.persons.get("editor") or []
            names = [_last(p) for p in persons]
            if not names:
                who = Text.from_latex(entry.fields.get("title", entry.key)).render_as("text")
            elif len(names) == 1:
                who = names[0]
            elif len(names) == 2:
                who = f"{names[0]} and {names[1]}"
            else:
                who = f"{names[0]} et al."
            label = f"{who}, {entry.fields.get('year', 'n.d.')}"
            seen[label] = seen.get(label, 0) + 1
            yield label if seen[label] == 1 else f"{label}{'abcdefghij'[seen[label] - 1]}"


class AuthorYearLabelStyle(PlainStyle):
    default_label_style = "author_year_labels"


def setup(app):
    register_plugin("pybtex.style.labels", "author_year_labels", AuthorYearLabels)
    register_plugin("pybtex.style.formatting", "author_year_labels", AuthorYearLabelStyle)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
