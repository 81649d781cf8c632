"""What the recorded commands share (``python -m aiayn.experiment``, ``aiayn.variations``, ``aiayn.plan``): machinery,
hand-written, that no chapter imports.

    config      a run's settings, declared once (RunConfig nests chapter 10's TrainConfig), and its command line
    scoring     sacreBLEU as the literature's tables use it, test 2016's reference length, a run's checks
    health      the signs of a failed run: one sentence for every input, a source that does not matter
    launch      several runs at once, each its own process and log
    provenance  where and how a result was made: device, threads, torch, commit, command

None of it is about the paper: the Transformer, its training and its decoding live in the modules the chapters write
(``aiayn.model``, ``aiayn.training``, ``aiayn.decoding``, ...), and the book's recipes in chapter 10
(``aiayn.training.RECIPES``).
"""
