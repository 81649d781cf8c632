"""Course tooling: student notebooks from the exercise markers, and autograder checks that give the reference
solutions full marks and take the right points from deliberately wrong ones."""
import math

import nbformat
import pytest
import torch
import torch.nn.functional as F

from aiayn import course
from aiayn.course import grade

ROOT = course.ROOT


# ---- generating student notebooks ------------------------------------------------------------------------

def _toy_notebook():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import importlib.util  # set-up"),
        nbformat.v4.new_markdown_cell("# Toy\n\nText."),
        nbformat.v4.new_code_cell("def helper():\n    ### BEGIN SOLUTION\n    return 0\n    ### END SOLUTION"),  # before Exercises
        nbformat.v4.new_markdown_cell("## Exercises\n\n1. Think.\n2. **Code:** double it."),
        nbformat.v4.new_code_cell("def double(x):\n    ### BEGIN SOLUTION\n    y = 2 * x\n    return y\n    ### END SOLUTION",
                                  outputs=[], execution_count=3),
        nbformat.v4.new_code_cell("assert double(2) == 4\nassert double(0) == 0"),
        nbformat.v4.new_markdown_cell("3. **Code:** a constant."),
        nbformat.v4.new_code_cell("### BEGIN SOLUTION\nC = 7\n### END SOLUTION"),
        nbformat.v4.new_code_cell("print(C)"),  # no assert: not a test cell
    ]
    return nb


def test_find_exercises_from_markers():
    exercises = course.find_exercises(_toy_notebook(), "07_toy")
    assert [(e.number, e.solution_cell, e.test_cell, e.names, e.points) for e in exercises] == [
        (None, 2, None, ["helper"], 0), (2, 4, 5, ["double"], 2), (3, 7, None, ["C"], 0)]


def test_strip_solution_keeps_indentation_and_rejects_bad_markers():
    src = "def f(x):\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION\n# after"
    assert course.strip_solution(src) == "def f(x):\n    # YOUR CODE HERE\n    raise NotImplementedError()\n# after"
    with pytest.raises(ValueError):
        course.strip_solution("### BEGIN SOLUTION\nx = 1")


def test_generate_toy_notebook(tmp_path):
    src = tmp_path / "07_toy.ipynb"
    nbformat.write(_toy_notebook(), src)
    [out] = course.generate(tmp_path / "student", [src], nbgrader=tmp_path / "nbgrader")
    nb = nbformat.read(out, as_version=4)
    text = "\n".join(c.source for c in nb.cells)
    assert "BEGIN SOLUTION" not in text and "2 * x" not in text and "C = 7" not in text
    assert nb.cells[0].source == "import importlib.util  # set-up"  # the set-up cell stays first (Colab)
    assert "Student version" in nb.cells[1].source
    sol = next(c for c in nb.cells if c.source.startswith("def double"))
    assert sol.source == "def double(x):\n    # YOUR CODE HERE\n    raise NotImplementedError()"
    assert sol.metadata["nbgrader"]["solution"] is True
    test = next(c for c in nb.cells if c.source.startswith("assert double"))
    assert test.metadata["nbgrader"] == {"grade": True, "grade_id": "test_double", "locked": True, "points": 2,
                                         "schema_version": 3, "solution": False}
    assert all(c.get("outputs", []) == [] for c in nb.cells if c.cell_type == "code")
    assert "feedback(globals()" in nb.cells[-1].source
    nbformat.validate(nb)
    # the nbgrader source keeps the solutions and carries the metadata
    source = nbformat.read(tmp_path / "nbgrader" / "source" / "07_toy" / "07_toy.ipynb", as_version=4)
    assert "y = 2 * x" in "\n".join(c.source for c in source.cells)
    assert (tmp_path / "nbgrader" / "nbgrader_config.py").exists()
    # the book's file is untouched
    assert "y = 2 * x" in src.read_text()


def test_generate_every_chapter(tmp_path):
    written = course.generate(tmp_path)
    assert written, "no notebook with coding exercises found"
    for path in written:
        nb = nbformat.read(path, as_version=4)
        book = nbformat.read(next(p for p in (ROOT / "book" / path.name, ROOT / "course" / path.name) if p.exists()),
                             as_version=4)
        n = len(course.find_exercises(book, path.stem))
        text = "\n".join(c.source for c in nb.cells)
        assert course.BEGIN not in text and text.count("raise NotImplementedError()") >= n
        first_code = next(c for c in nb.cells if c.cell_type == "code")
        assert "find_spec(\"aiayn\")" in first_code.source  # the first code cell installs the package in Colab
        graded = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
        assert len(graded) == sum(e.test_cell is not None for e in course.find_exercises(book, path.stem))


def test_student_version_fails_and_solution_passes_visible_tests(tmp_path):
    """Executing the toy's student version: its test cell fails; the book version passes (grade_notebook)."""
    src = tmp_path / "07_toy.ipynb"
    nbformat.write(_toy_notebook(), src)
    [student] = course.generate(tmp_path / "student", [src])
    for path, points in [(src, 2), (student, 0)]:
        result = course.grade_notebook(path, timeout=60)
        visible = [c for c in result["checks"] if c["assignment"] == "visible tests"]
        assert [(c["check"], c["points"], c["max_points"]) for c in visible] == [("test_double", points, 2)]


# ---- reference solutions get full marks ------------------------------------------------------------------

def my_attention(query, key, value, mask=None):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1) @ value


def heads_in_a_loop(layer, x, mask=None):
    from aiayn.attention import attention
    d_k, outputs = layer.d_k, []
    for i in range(layer.h):
        rows = slice(i * d_k, (i + 1) * d_k)
        q, k, v = (x @ W.weight[rows].T + W.bias[rows] for W in (layer.W_Q, layer.W_K, layer.W_V))
        outputs.append(attention(q, k, v, mask)[0])
    return layer.W_O(torch.cat(outputs, dim=-1))


def my_encoding(max_len, d_model):
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    angle = pos / 10000 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    return torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1).float()


def my_rate(step, d_model, warmup, factor=1.0):
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def my_train_epoch(model, batches, optimizer, scheduler, accum):
    for i, batch in enumerate(batches, 1):
        (model(batch) / accum).backward()
        if i % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()


def my_label_smoothing(logits, target, eps_ls, pad_id):
    V = logits.size(-1)
    q = torch.full_like(logits, eps_ls / (V - 2))
    q[..., pad_id] = 0
    q.scatter_(-1, target[..., None], 1 - eps_ls)
    return -(q * logits.log_softmax(-1)).sum(-1).masked_fill(target == pad_id, 0).sum()


class MyLabelSmoothingLoss:
    def __init__(self, eps_ls, pad_id):
        self.eps_ls, self.pad_id = eps_ls, pad_id

    def __call__(self, logits, target):
        return my_label_smoothing(logits, target, self.eps_ls, self.pad_id)


def my_greedy_decode(model, src, max_len):
    memory, src_mask = model.encode(src)
    ys = torch.full((src.size(0), 1), 1, dtype=torch.long)
    for _ in range(max_len):
        logits = model.generator(model.decode(ys, memory, src_mask)[:, -1])
        logits[:, :2] = -math.inf  # never <pad> or <s>
        ys = torch.cat([ys, logits.argmax(-1, keepdim=True)], 1)
        if (ys == 2).any(1).all():
            break
    return ys


def my_corpus_bleu(hyps, refs):
    from collections import Counter

    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a
    tok = Tokenizer13a()
    match, total, hyp_len, ref_len = [0] * 4, [0] * 4, 0, 0
    for h, r in zip(hyps, refs):
        h, r = tok(h).split(), tok(r).split()
        hyp_len, ref_len = hyp_len + len(h), ref_len + len(r)
        for n in range(1, 5):
            hc = Counter(tuple(h[i:i + n]) for i in range(len(h) - n + 1))
            rc = Counter(tuple(r[i:i + n]) for i in range(len(r) - n + 1))
            match[n - 1] += sum(min(c, rc[g]) for g, c in hc.items())
            total[n - 1] += max(len(h) - n + 1, 0)
    if hyp_len == 0 or match[0] == 0:
        return 0.0
    k, logp = 1, 0.0
    for m, t in zip(match, total):  # sacreBLEU's default 'exp' smoothing
        if t == 0:
            return 0.0
        if m == 0:
            k *= 2
            logp += math.log(100.0 / (k * t))
        else:
            logp += math.log(100.0 * m / t)
    bp = 1.0 if hyp_len >= ref_len else math.exp(1 - ref_len / hyp_len)
    return bp * math.exp(logp / 4)


REFERENCE = {"attention": my_attention, "multi_head": heads_in_a_loop, "positional": my_encoding,
             "schedule": my_rate, "accumulation": my_train_epoch, "label_smoothing": my_label_smoothing,
             "greedy": my_greedy_decode, "bleu": my_corpus_bleu}


@pytest.mark.parametrize("assignment", sorted(REFERENCE))
def test_reference_solutions_get_full_marks(assignment):
    g = grade(assignment, REFERENCE[assignment])
    assert g.points == g.max_points > 0, str(g)


def test_class_and_namespace_forms():
    assert grade("label_smoothing", MyLabelSmoothingLoss).failed == set()
    points, max_points, report = grade("attention", {"my_attention": my_attention, "other": 1})
    assert points == max_points and len(report) == len(course.ASSIGNMENTS["attention"].checks)
    missing = grade("attention", {"something_else": my_attention})
    assert missing.points == 0 and "my_attention" in missing.report[0].message


def test_every_required_assignment_exists():
    assert {"attention", "multi_head", "positional", "schedule", "accumulation", "label_smoothing",
            "greedy", "bleu"} <= set(course.ASSIGNMENTS)


def _chapter_namespace():
    import importlib
    import pkgutil

    import aiayn
    ns = {"torch": torch, "math": math, "F": F, "nn": torch.nn}
    for m in pkgutil.iter_modules(aiayn.__path__):
        if not m.name.startswith("_") and m.name not in ("course", "data"):
            module = importlib.import_module(f"aiayn.{m.name}")
            ns.update({k: v for k, v in vars(module).items() if not k.startswith("_")})
    return ns


def test_the_books_own_solutions_get_full_marks():
    """Each chapter exercise that an assignment grades: its reference solution, run from the chapter's cell."""
    graded = 0
    for path in course.sources():
        nb = nbformat.read(path, as_version=4)
        for ex in course.find_exercises(nb, path.stem):
            for a in course.assignments_for(path.stem, ex.names):
                ns = _chapter_namespace()
                exec(nb.cells[ex.solution_cell].source, ns)
                g = grade(a.key, ns)
                assert g.points == g.max_points, f"{path.name}: {g}"
                graded += 1
    assert graded >= 3


# ---- wrong implementations lose the right points ----------------------------------------------------------

def test_missing_scale_loses_the_scale_points():
    def no_scale(query, key, value, mask=None):
        scores = query @ key.transpose(-2, -1)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return scores.softmax(dim=-1) @ value

    g = grade("attention", no_scale)
    assert g.failed == {"scores divided by sqrt(d_k) (known value 0.8808)", "matches the book's attention, no mask",
                        "matches the book's attention with padding and causal masks"}
    assert "not divided by sqrt(d_k)" in next(r.message for r in g.report if r.name.startswith("scores"))
    assert g.points == g.max_points - 7


MASK_CHECKS = {"a mask with one allowed key returns that key's value",
               "padding mask (batch, 1, 1, len_k): masked keys have no influence",
               "causal mask (len, len): no position sees the future",
               "matches the book's attention with padding and causal masks"}


def test_inverted_mask_loses_the_mask_points():
    def inverted(query, key, value, mask=None):
        scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
        if mask is not None:
            scores = scores.masked_fill(mask, -1e9)  # True taken as "masked out"
        return scores.softmax(dim=-1) @ value

    assert grade("attention", inverted).failed == MASK_CHECKS


def test_ignored_mask_loses_the_mask_points():
    assert grade("attention", lambda q, k, v, mask=None: my_attention(q, k, v)).failed == MASK_CHECKS


@pytest.mark.filterwarnings("ignore:Detected call of")
def test_schedule_stepped_per_micro_batch_loses_the_schedule_points():
    def per_batch(model, batches, optimizer, scheduler, accum):
        for i, batch in enumerate(batches, 1):
            (model(batch) / accum).backward()
            scheduler.step()  # wrong: once per micro-batch
            if i % accum == 0:
                optimizer.step()
                optimizer.zero_grad()

    g = grade("accumulation", per_batch)
    assert g.failed == {"schedule stepped once per optimizer update, not per micro-batch"}, str(g)
    assert g.points == g.max_points - 3


def test_no_accumulation_loses_update_points():
    def every_batch(model, batches, optimizer, scheduler, accum):
        for batch in batches:
            model(batch).backward()
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()

    assert "one optimizer update per accum micro-batches" in grade("accumulation", every_batch).failed


def test_label_smoothing_with_mass_on_padding_loses_the_padding_points():
    def on_padding(logits, target, eps_ls, pad_id):
        V = logits.size(-1)
        q = torch.full_like(logits, eps_ls / (V - 1))  # wrong: the padding column gets eps_ls / (V - 1) too
        q.scatter_(-1, target[..., None], 1 - eps_ls)
        return -(q * logits.log_softmax(-1)).sum(-1).masked_fill(target == pad_id, 0).sum()

    g = grade("label_smoothing", on_padding)
    assert g.failed == {"no probability on the padding token", "eps_ls spread over the V - 2 other tokens",
                        "matches the book's LabelSmoothingLoss"}, str(g)


def test_label_smoothing_counting_padding_rows_loses_points():
    def pad_rows(logits, target, eps_ls, pad_id):
        return my_label_smoothing(logits, target.clamp(min=1), eps_ls, pad_id)  # padding rows scored as token 1

    assert "padding positions contribute nothing" in grade("label_smoothing", pad_rows).failed


def test_torch_label_smoothing_puts_mass_on_padding():
    def torch_ls(logits, target, eps_ls, pad_id):
        return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=pad_id,
                               label_smoothing=eps_ls, reduction="sum")

    assert "no probability on the padding token" in grade("label_smoothing", torch_ls).failed


def test_wrong_positional_and_schedule_lose_points():
    def halves(max_len, d_model):  # sines then cosines, not interleaved
        pe = my_encoding(max_len, d_model)
        return torch.cat([pe[:, 0::2], pe[:, 1::2]], dim=1)

    assert "sine on even, cosine on odd dimensions" in grade("positional", halves).failed
    assert "decay as step^-0.5" in grade("schedule", lambda s, d, w, f=1.0: f * d**-0.5 * min(1 / s, s * w**-2)).failed


def test_decoding_and_bleu_errors_lose_points():
    def no_stop(model, src, max_len):
        ys = torch.full((src.size(0), 1), 1, dtype=torch.long)
        memory, src_mask = model.encode(src)
        for _ in range(max_len):
            nxt = model.generator(model.decode(ys, memory, src_mask)[:, -1]).argmax(-1, keepdim=True)
            ys = torch.cat([ys, nxt.masked_fill(nxt == 2, 3)], 1)  # never emits EOS
        return ys

    assert "follows the most likely token (known chain)" in grade("greedy", no_stop).failed
    no_bp = lambda h, r: my_corpus_bleu(h, r) / min(1.0, math.exp(1 - sum(len(x.split()) for x in r)  # noqa: E731
                                                                   / max(1, sum(len(x.split()) for x in h))))
    assert "brevity penalty" in grade("bleu", no_bp).failed


# ---- the references are locked out ----------------------------------------------------------------------

def test_importing_the_reference_does_not_pass():
    from aiayn.attention import attention
    from aiayn.positional import sinusoidal_encoding
    from aiayn.training import LabelSmoothingLoss, rate

    assert grade("attention", lambda q, k, v, mask=None: attention(q, k, v, mask)[0]).points == 0
    assert grade("attention", lambda q, k, v, mask=None: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)).points == 0
    assert grade("multi_head", lambda layer, x, mask=None: layer(x, x, x, mask)[0]).points == 0
    assert grade("positional", lambda n, d: sinusoidal_encoding(n, d)).points == 0
    assert grade("schedule", lambda s, d, w, f=1.0: rate(s, d, w, f)).points == 0
    assert grade("label_smoothing", lambda lo, t, e, p: LabelSmoothingLoss(e, p)(lo, t)).points == 0

    class Sub(LabelSmoothingLoss):
        pass

    assert grade("label_smoothing", Sub).points == 0
    import sacrebleu
    assert grade("bleu", lambda h, r: sacrebleu.corpus_bleu(h, [r]).score).points == 0
    # and everything is restored afterwards
    torch.testing.assert_close(attention(torch.ones(1, 2, 4), torch.ones(1, 3, 4), torch.ones(1, 3, 2))[0],
                               torch.ones(1, 2, 2))
    assert rate(4000, 512, 4000) == 512**-0.5 * 4000**-0.5


def test_chapter_copy_in_the_namespace_is_locked_too():
    """A chapter defines its own `attention` in the notebook; calling it from the exercise does not pass."""
    ns = {}
    exec("import math\ndef attention(q, k, v, mask=None):\n"
         "    s = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)))\n"
         "    s = s.masked_fill(~mask, float('-inf')) if mask is not None else s\n"
         "    return s.softmax(-1) @ v, None\n"
         "def my_attention(q, k, v, mask=None):\n    return attention(q, k, v, mask)[0]\n", ns)
    assert grade("attention", ns).points == 0
    assert ns["attention"].__name__ == "attention"  # restored
