"""aiayn: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017), as built by the book.

Each module is written by one chapter (see ``aiayn._export``); import from the modules directly,
for example ``from aiayn.attention import attention``.
"""
__version__ = "0.1.0"
