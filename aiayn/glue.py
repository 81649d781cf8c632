"""Numbers in the book's prose come from the code: myst-nb's ``glue`` stores a value under a name, and the text shows
it with ``{glue:text}`name:format```. In Colab and plain Jupyter, where myst-nb is not installed, ``glue`` only
shows the value (when asked to), so every chapter runs there unchanged.

Not about the paper: a tool that puts measured numbers into the chapters' prose.
"""

try:
    from myst_nb import glue
except ImportError:  # not building the book

    def glue(name: str, variable, display: bool = True) -> None:
        """Show ``variable`` (if ``display``); without myst-nb there is no page to insert it into."""
        if display:
            from IPython.display import display as show

            show(variable)


def stored_run(notebook: str) -> dict | None:
    """How long a chapter's stored run took and on what machine, from the metadata that ``python -m aiayn._book
    execute`` writes into the notebook (its cells' own timestamps where that record is missing); None without the
    notebook file (a chapter opened alone, before the set-up cell has cloned the book)."""
    import datetime
    import json

    from aiayn import ROOT

    path = ROOT / "book" / notebook
    if not path.is_file():
        return None
    nb = json.loads(path.read_text(encoding="utf-8"))
    record = nb.get("metadata", {}).get("aiayn", {}).get("executed")
    if record:
        return record
    times = [
        datetime.datetime.fromisoformat(t.replace("Z", "+00:00"))
        for c in nb["cells"]
        for key in ("iopub.execute_input", "shell.execute_reply")
        if (t := c.get("metadata", {}).get("execution", {}).get(key))
    ]
    return {"seconds": (max(times) - min(times)).total_seconds(), "device": None} if times else None


def setup_page(notebook: str) -> None:
    """A chapter's hidden first cell: figures drawn at twice their pixels (sharp on high-density screens, the same
    size on the page), and ``run_s`` (seconds) and ``run_on`` (the machine) of its stored run glued for its first
    lines."""
    try:
        from matplotlib_inline.backend_inline import set_matplotlib_formats

        set_matplotlib_formats("retina")
    except ImportError:  # not in a Jupyter kernel
        pass
    run = stored_run(notebook)
    if run is None:
        return
    glue("run_s", float(round(run["seconds"])), display=False)
    glue("run_on", run_on(run), display=False)


def run_on(run: dict) -> str:
    """The machine of a stored run, as a chapter's first lines name it."""
    return f"{run['cores']} cores of an {run['device']}" if run.get("device") else "a CPU"
