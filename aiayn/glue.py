"""Numbers in the book's prose come from the code: myst-nb's ``glue`` stores a value under a name, and the text shows
it with ``{glue:text}`name:format```. In Colab and plain Jupyter, where myst-nb is not installed, ``glue`` only
shows the value (when asked to), so every chapter runs there unchanged."""
try:
    from myst_nb import glue
except ImportError:  # not building the book
    def glue(name: str, variable, display: bool = True) -> None:
        """Show ``variable`` (if ``display``); without myst-nb there is no page to insert it into."""
        if display:
            from IPython.display import display as show

            show(variable)
