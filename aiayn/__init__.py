"""aiayn: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017), as built by the book.

Import from the modules directly, for example ``from aiayn.attention import attention``.

The chapters write the model and its parts (``python -m aiayn._export`` copies their cells tagged ``export``; each of
these modules says on its first line which chapter it comes from):

    attention       §3.2.1  scaled dot-product attention, masks          book/02_attention.ipynb
    multi_head      §3.2.2  multi-head attention                         book/03_multi_head.ipynb
    feed_forward    §3.3    position-wise feed-forward network           book/04_feed_forward.ipynb
    embeddings      §3.4    shared embeddings and softmax                book/05_embeddings.ipynb
    positional      §3.5    sinusoidal positional encoding               book/06_positional_encoding.ipynb
    model           §3.1    encoder, decoder, the full model             book/07_model.ipynb
    complexity      §4      the layers of Table 1, measured              book/08_why_self_attention.ipynb
    tokenization,   §5.1    joint BPE, batches by token count            book/09_data.ipynb
    batching
    training        §5.2-4  optimizer, schedule, loop; the recipes       book/10_training.ipynb
    decoding, bleu  §6.1    beam search, averaging, BLEU                 book/11_decoding.ipynb
    floor, results  §6.1    nn.Transformer's layers; the results pages   book/12_results.ipynb

The rest is written by hand. The layout has one rule: the top level holds what the chapters write (above), what a
chapter or a reader imports, and the recorded commands; a folder holds machinery that no chapter imports.

    data, corpus    Multi30k downloaded and checked; its sentences encoded once, in a cache (chapters 9-11)
    pretrained      the shipped models: download, check, translate, attention maps (chapters 2, 3, 12)
    glue            numbers from the output that measured them into the chapters' prose
    experiment      python -m aiayn.experiment: one run of §6.1 (train, average, beam-search, score)
    variations      python -m aiayn.variations: Table 3's rows as runs
    plan            python -m aiayn.plan: the GPU stages, and their rehearsal on the CPU
    browser         python -m aiayn.browser: the "Try the model" page's ONNX export and its parity (web/ holds the page)
    _book, _export  the book's tools: execute a chapter and store its outputs; write the generated modules
    runs/           what the commands share: configuration, scoring, health checks, launcher, provenance
    course/         the graded exercises: assignments, checks, grader, kernel (a package of a clone, left out of
                    the installed wheel; no module above imports it)

The convention that tells generated from hand-written: a generated module's first line is "# Generated from
book/..." and it keeps the chapter's form (79 columns); every other module is formatted by ruff at 120 columns
(pyproject.toml), and `make test` checks both. No module of the results pages (results, glue) imports one that trains.
"""

from pathlib import Path

__version__ = "0.1.0"
ROOT = Path(__file__).resolve().parents[1]  # the checkout (or clone) that holds book/, results/ and pretrained/
