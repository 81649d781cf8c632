# Generated from book/12_results.ipynb by `python -m aiayn._export`. Edit the chapter, not this file.

# book/12_results.ipynb: Where the numbers come from
"""§6.1 results: read the stored runs (the CPU recipe's, and the GPU
recipe's when a GPU was lent), set them beside the paper, the literature and
the floor. Reads files only: nothing here trains."""
import json
import os
import textwrap
from pathlib import Path

import altair as alt
import matplotlib.lines as mlines
import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import numpy as np
import pandas as pd
import sacrebleu

from aiayn import ROOT

# a clone's results/; set AIAYN_RESULTS to read them from elsewhere
RESULTS = Path(os.environ.get("AIAYN_RESULTS", ROOT / "results"))
DIRECTIONS = ("en-de", "de-en")
# val and the four test sets, as aiayn.experiment scores them
SPLITS = ("val", "test2016", "test2017", "mscoco2017", "test2018")
CPU = "python -m aiayn.experiment --recipe cpu"
RUNS = {  # stored run -> (whose layers, the command that writes it)
    "cpu-en-de": ("ours", f"{CPU} --direction en-de --out results/cpu-en-de"),
    "cpu-de-en": ("ours", f"{CPU} --direction de-en --out results/cpu-de-en"),
    # ten minutes for the whole command (val and test 2016 only); --curve
    # then scores checkpoints on val, after the ten minutes (curve.json)
    **{f"cpu-fast-{d}": ("ours", f"python -m aiayn.experiment --recipe "
                                 f"cpu-fast --direction {d} --curve 2 "
                                 f"--out results/cpu-fast-{d}")
       for d in DIRECTIONS},
    # the floor trains for as many updates as cpu-en-de did (its metrics.json
    # says how many): the same schedule, whatever else shares the machine
    "cpu-floor-en-de": ("floor", f"{CPU} --direction en-de --layers torch "
                                 "--max-updates UPDATES --time-budget 7200 "
                                 "--splits val test2016 "
                                 "--out results/cpu-floor-en-de"),
    # on one GPU, eight runs at once: these four and two more seeds of each
    # direction (SEEDS); python -m aiayn.plan run final makes all eight
    **{f"gpu-{floor}{d}": ("floor" if floor else "ours",
                           f"python -m aiayn.experiment --recipe gpu "
                           f"--direction {d}"
                           + (" --layers torch" if floor else "")
                           + f" --out results/gpu-{floor}{d}")
       for floor in ("", "floor-") for d in DIRECTIONS}}
GPU_RUNS = tuple(name for name in RUNS if name.startswith("gpu-"))
SEARCH = "cpu-search"  # the runs that chose the CPU recipe, on val only
FAST_SEARCH = "cpu-fast-search"  # the runs that chose cpu-fast, on val only
TWENTY = "cpu-20min"  # recipes given twenty minutes (EN→DE), on val
GPU_SEARCH = "gpu-search"  # the runs that chose the GPU recipe, on val only
SEEDS = "gpu-seeds"  # seeds 1 and 2 of the GPU recipe (val and test 2016)
STAGE = {  # what the GPU plan writes besides the runs, and in which stage
    "bench_decode.json": "final",
    "bench_train.json": "speed", "bench_train_compiled.json": "speed",
    "bench_train_multi30k.json": "speed",
    "bench_train_multi30k_fp16.json": "speed", "layers_gpu.json": "speed",
    "variations": "search", "scaling.json": "search", "recipe.json": "search"}


# book/12_results.ipynb: Where the numbers come from
def load_json(path) -> dict | None:
    """A JSON file as a dict, or None when the file is not there."""
    path = Path(path)
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def load_run(folder) -> dict | None:
    """One run of aiayn.experiment: metrics, history and the attention
    file's path; None without metrics.json."""
    folder = Path(folder)
    metrics = load_json(folder / "metrics.json")
    if metrics is None:
        return None
    attention = folder / "attention.npz"
    return {"folder": folder, "metrics": metrics,
            "history": load_json(folder / "history.json"),
            "attention": attention if attention.is_file() else None}


def hypotheses(run: dict, split: str) -> list[str]:
    """The stored beam-search output of one split, one line per source
    sentence."""
    path = run["folder"] / f"hyp.{split}.txt"
    lines = path.read_text(encoding="utf-8").split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def missing(name: str) -> str:
    """What to say when a stored result is absent: that it is, and the
    command that writes it (a run's own, or the GPU plan's stage)."""
    if name in RUNS:
        where = " on a GPU" if name in GPU_RUNS else ""
        return wrap(f"{name}: not stored yet. It is made{where} by\n"
                    f"    {RUNS[name][1]}")
    return (f"{name}: not stored yet. It is made on a GPU by\n"
            f"    python -m aiayn.plan run {STAGE[name]} --out DIR\n"
            f"and copied into results/ by\n"
            f"    python -m aiayn.plan install DIR")


def label(name: str, run: dict) -> str:
    """How a stored run is named in tables and legends: whose layers, the
    kind of device (and the ten-minute recipe), the direction."""
    on_gpu = run["metrics"]["provenance"].get("cuda") is not None
    fast = "-fast" if run["metrics"].get("recipe") == "cpu-fast" else ""
    return (f"{RUNS[name][0]}, {'GPU' if on_gpu else 'CPU' + fast} "
            f"({run['metrics']['direction']})")


def wrap(text: str, width: int = 79) -> str:
    """Each line of ``text`` wrapped to ``width`` columns, continued with two
    more spaces of indent than the line it continues."""
    out = []
    for line in text.splitlines():
        indent = " " * (len(line) - len(line.lstrip()) + 2)
        out.append(textwrap.fill(line, width, subsequent_indent=indent,
                                 break_on_hyphens=False))
    return "\n".join(out)


# book/12_results.ipynb: Where the numbers come from
def commit_of(provenance: dict) -> str:
    """The commit whose code made a result: ``tree_commit`` where a GPU
    machine ran a copy of the tree whose own git saw another history (its
    ``git_commit`` is kept as it reported it), else ``git_commit``."""
    return provenance.get("tree_commit") or provenance.get("git_commit") \
        or "unknown"


def provenance_line(report: dict) -> str:
    """Where a stored figure came from: device, torch and CUDA, commit, date,
    wall time, sharing and command line."""
    p = report["provenance"]
    commit = commit_of(p)[:10]
    if p.get("git_dirty") and not p.get("tree_commit"):
        commit += " with uncommitted changes"
    cuda = f", CUDA {p['cuda']}" if p.get("cuda") else ""
    device = p["device"]
    if p.get("cpu_cores"):  # a CPU: its cores and the threads the run used
        device += f", {p['cpu_cores']} cores, {p['threads']} thread(s)"
    parts = [device, f"torch {p['torch']}{cuda}", f"commit {commit}",
             p["date"][:10],
             f"{p.get('concurrent_runs', 1)} run(s) sharing the device"]
    wall = p.get("wall_s")
    if isinstance(wall, dict):
        parts.append(f"{wall['total']:.0f} s in all, "
                     f"{wall['train']:.0f} s of training")
    return " | ".join(parts) + f"\n  command: {p['command']}"


def config_line(metrics: dict) -> str:
    """The model, data and decoding settings of a run, in the paper's
    names."""
    c, d, dec = metrics["model_config"], metrics["data"], metrics["decoding"]
    return (f"{metrics.get('layers', 'aiayn')} layers, N={c['N']} "
            f"d_model={c['d_model']} d_ff={c['d_ff']} h={c['h']} "
            f"P_drop={c['P_drop']} eps_ls={c['eps_ls']}, "
            f"{metrics['parameters'] / 1e6:.2f}M parameters; joint BPE "
            f"{d['bpe_size']}, {d['max_tokens']}-token batches; "
            f"{metrics['updates']} updates in {metrics['epochs']} epochs "
            f"(stopped by {metrics['stopped_by']}); average of "
            f"{len(metrics['averaged_checkpoints'])} checkpoints; "
            f"beam {dec['beam_size']}, alpha {dec['alpha']}; "
            f"{metrics.get('precision', 'fp32')}")


def describe(run: dict, label: str) -> str:
    """The provenance block printed under every table and figure made from
    a run, wrapped to 79 columns."""
    m = run["metrics"]
    if m["bleu"]:
        signature = next(iter(m["bleu"].values()))["sacrebleu"]["signature"]
    else:
        signature = "no split scored"
    return wrap(f"{label} [{run['folder'].name}/metrics.json]\n"
                f"  {provenance_line(m)}\n  {config_line(m)}\n"
                f"  sacreBLEU signature: {signature}")


# book/12_results.ipynb: BLEU against the paper, the literature and the floor
SACREBLEU = "cased sacreBLEU (13a)"
TOK_LC = "lowercased Moses-tokenised BLEU"
TEST_SETS = {"val": "Multi30k val", "test2016": "Multi30k test 2016",
             "test2017": "Multi30k test 2017",
             "mscoco2017": "Multi30k MSCOCO 2017",
             "test2018": "Multi30k test 2018"}
WMT = "another data set (WMT 2014, 4.5M pairs): not comparable"
ANCHORS = pd.DataFrame([  # published figures, as their papers report them
    ("Vaswani et al. (2017), base", "en-de", "WMT newstest2014",
     "tokenised BLEU, cased", 27.3, WMT),
    ("Vaswani et al. (2017), big", "en-de", "WMT newstest2014",
     "tokenised BLEU, cased", 28.4, WMT),
    ("Wu et al. (2021), text-only", "en-de", TEST_SETS["test2016"], TOK_LC,
     41.02, "4+4 layers, d 128, dropout 0.3, averaged checkpoints"),
    ("bentrevett tutorial", "de-en", TEST_SETS["test2016"],
     "lowercased tokenised BLEU", 36.52,
     "greedy decoding, the tutorial's own tokens"),
], columns=["system", "direction", "test set", "metric", "BLEU", "note"])


# book/12_results.ipynb: BLEU against the paper, the literature and the floor
def our_rows(label: str, run: dict, split: str = "test2016") -> pd.DataFrame:
    """A run's two BLEU figures on one split, as rows of the comparison
    table."""
    m, s = run["metrics"], run["metrics"]["bleu"][split]
    note = (f"{m['parameters'] / 1e6:.1f}M parameters, {m['updates']} "
            f"updates, beam 4, alpha 0.6, on {m['provenance']['device']}")
    metrics = ((SACREBLEU, "sacrebleu"), (TOK_LC, "tok_lc"))
    return pd.DataFrame([(label, m["direction"], TEST_SETS[split], metric,
                          s[key]["score"], note) for metric, key in metrics],
                        columns=ANCHORS.columns)


def bleu_table(runs: dict[str, dict],
               split: str = "test2016") -> pd.DataFrame:
    """Our runs (label -> run) and the published figures, direction by
    direction, ours first."""
    parts = []
    for direction in DIRECTIONS:
        parts += [our_rows(label, run, split) for label, run in runs.items()
                  if run["metrics"]["direction"] == direction
                  and split in run["metrics"]["bleu"]]
        parts.append(ANCHORS[ANCHORS["direction"] == direction])
    return pd.concat(parts, ignore_index=True)


def scores_table(run: dict) -> pd.DataFrame:
    """Every scored split of a run: both BLEUs, the brevity penalty,
    output/reference length, decoding time."""
    rows = []
    for split, s in run["metrics"]["bleu"].items():
        sb = s["sacrebleu"]
        rows.append({"split": split, "sentences": s["sentences"],
                     SACREBLEU: sb["score"], TOK_LC: s["tok_lc"]["score"],
                     "BP": sb["bp"],
                     "length ratio": sb["sys_len"] / sb["ref_len"],
                     "decode s": s["decode_s"]})
    return pd.DataFrame(rows).set_index("split")


def plot_bleu(table: pd.DataFrame, ours: list[str]):
    """Multi30k test 2016 BLEU of our runs (labels ``ours``) and the
    anchors, one panel per direction, bars by metric."""
    rows = table[table["test set"] == TEST_SETS["test2016"]]
    colors = {SACREBLEU: "C0", TOK_LC: "C1", "lowercased tokenised BLEU": "C2"}
    counts = [int((rows["direction"] == d).sum()) for d in DIRECTIONS]
    fig, axes = plt.subplots(len(DIRECTIONS), 1, dpi=100, sharex=True,
                             figsize=(6.8, 1.2 + 0.42 * sum(counts)),
                             gridspec_kw={"height_ratios": counts})
    for ax, direction in zip(axes, DIRECTIONS):
        part = rows[rows["direction"] == direction].iloc[::-1]
        y = np.arange(len(part))
        bars = ax.barh(y, part["BLEU"],
                       color=[colors[m] for m in part["metric"]],
                       hatch=["" if s in ours else "//"
                              for s in part["system"]], edgecolor="white")
        ax.bar_label(bars, fmt="%.2f", fontsize=9, padding=2)
        ax.set_yticks(y, [f"{s}\n{m}" for s, m in
                          zip(part["system"], part["metric"])], fontsize=9)
        stored = part["system"].isin(ours).any()
        title = direction.replace("-", " → ").upper()
        ax.set_title(title + ("" if stored else ": no run of ours stored yet"))
        ax.set_xlim(0, 50)
    axes[-1].set_xlabel("BLEU on Multi30k test 2016")
    fig.tight_layout()
    return fig


# book/12_results.ipynb: Did the runs work?
def checks_table(runs: dict[str, dict], labels: dict[str, str]
                 ) -> pd.DataFrame:
    """The signs of a failed run (aiayn.runs.health), run by run: how alike the
    test 2016 outputs are and what the source is worth on validation."""
    rows = {}
    for name, run in runs.items():
        c = run["metrics"].get("checks")
        if c is None:  # written before the checks existed
            continue
        out = c["outputs"].get("test2016") or next(iter(c["outputs"].values()))
        rows[labels[name]] = {
            "distinct outputs %": 100 * out["distinct"],
            "most common output %": 100 * out["most_common_share"],
            "val NLL": c["source"]["nll"],
            "val NLL, wrong source": c["source"]["nll_wrong_source"],
            "warnings": len(c["warnings"])}
    return pd.DataFrame(rows).T


# book/12_results.ipynb: Loss and perplexity
def history_frames(history: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-update training curve (step, loss, lr, epoch) and per-epoch
    validation (epoch, step, val_loss, val_ppl)."""
    train = pd.DataFrame({k: history[k]
                          for k in ("step", "loss", "lr", "epoch")})
    epoch_end = train.groupby("epoch")["step"].max()
    val = pd.DataFrame({"epoch": range(1, len(history["val_loss"]) + 1),
                        "val_loss": history["val_loss"],
                        "val_ppl": history["val_ppl"]})
    val.insert(1, "step", val["epoch"].map(epoch_end))
    return train, val


def plot_history(histories: dict[str, dict]):
    """Label-smoothed training loss per update (and its running mean),
    validation loss and perplexity per epoch."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(6.8, 4.2), dpi=100)
    for i, (label, history) in enumerate(histories.items()):
        train, val = history_frames(history)
        color = f"C{i}"
        ax1.plot(train["step"], train["loss"], color=color, lw=0.5, alpha=0.3)
        window = max(1, len(train) // 50)
        mean = train["loss"].rolling(window, min_periods=1).mean()
        ax1.plot(train["step"], mean, color=color, lw=1.2)
        ax1.plot(val["step"], val["val_loss"], "o--", color=color, ms=3,
                 lw=0.8)
        ax2.plot(val["step"], val["val_ppl"], "o-", color=color, ms=3,
                 label=label)
    ax1.set_xlabel("update")
    ax1.set_ylabel("label-smoothed loss per token")
    styles = [mlines.Line2D([], [], color="grey", lw=1.2,
                            label="training (running mean)"),
              mlines.Line2D([], [], color="grey", ls="--", marker="o", ms=3,
                            lw=0.8, label="validation")]
    ax1.legend(handles=styles, fontsize=8)
    ax2.set_xlabel("update")
    ax2.set_ylabel("validation perplexity")
    ax2.set_yscale("log")
    ax2.yaxis.set_major_formatter(mticker.FormatStrFormatter("%g"))
    ax2.yaxis.set_minor_formatter(
        mticker.LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.4)))
    fig.legend(*ax2.get_legend_handles_labels(), loc="lower center",
               ncol=2, fontsize=8, frameon=False)  # one colour per run
    fig.tight_layout(rect=(0, 0.06 * ((len(histories) + 1) // 2) + 0.02, 1, 1))
    return fig


# book/12_results.ipynb: The CPU recipe and the search that chose it
def peak_lr(metrics: dict) -> float:
    """The largest learning rate of a run's schedule, Equation (3) at
    update `warmup`: factor · d_model^-0.5 · warmup^-0.5."""
    t, d_model = metrics["train_config"], metrics["model_config"]["d_model"]
    return t["factor"] * d_model**-0.5 * t["warmup"] ** -0.5


def search_runs(folder) -> dict[str, dict]:
    """The runs of a search folder (one sub-folder per run), by name."""
    found = (load_run(path) for path in sorted(Path(folder).glob("*/")))
    return {run["folder"].name: run for run in found if run is not None}


def search_table(runs: dict[str, dict]) -> pd.DataFrame:
    """One row per search run: what it changed, its validation scores (the
    only ones a search may read), the source check and its minutes."""
    rows = []
    for name, run in runs.items():
        m = run["metrics"]
        val = m["bleu"]["val"]
        rows.append({
            "run": name, "peak lr (1e-3)": 1e3 * peak_lr(m),
            "warmup": m["train_config"]["warmup"],
            "precision": m["precision"], "updates": m["updates"],
            "val ppl": m["val"]["ppl"], "val BLEU": val["tok_lc"]["score"],
            "source gain": m["checks"]["source"]["gain"],
            "warnings": len(m["warnings"]),
            "train min": m["provenance"]["wall_s"]["train"] / 60})
    return pd.DataFrame(rows).set_index("run")


# book/12_results.ipynb: A ten-minute CPU recipe
def plot_curves(curves: dict[str, dict]):
    """Validation BLEU against minutes of training, one line per run
    (label -> its curve.json): each checkpoint alone, and a star for the
    average of the last ones at the end of training."""
    fig, ax = plt.subplots(figsize=(6.8, 3.6), dpi=100)
    for i, (label, curve) in enumerate(curves.items()):
        points = pd.DataFrame(curve["points"])
        ax.plot(points["train_s"] / 60, points["val_bleu"], "o-", ms=3,
                color=f"C{i}", label=label)
        end = curve["averaged"]
        ax.plot(end["train_s"] / 60, end["val_bleu"], "*", ms=11,
                color=f"C{i}")
    ax.set_xlabel("minutes of training on 2 CPU cores")
    ax.set_ylabel("validation BLEU (lowercased, tokenised)")
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def stored_curves() -> dict[str, tuple[str, dict | None]]:
    """Every curve the book keeps (--curve), as key -> (legend label, its
    curve.json, None where the run kept none): the ten-minute recipe's final
    runs, the recipes given twenty minutes (TWENTY), the half-hour recipe's
    runs."""
    runs = {f"cpufast_{d.replace('-', '')}":
            (f"cpu-fast, 10 min ({d})", RESULTS / f"cpu-fast-{d}")
            for d in DIRECTIONS}
    for path in sorted((RESULTS / TWENTY).glob("*/metrics.json")):
        d, name = load_json(path)["direction"], path.parent.name
        runs[f"twenty_{name.replace('-', '')}_{d.replace('-', '')}"] = (
            f"{name}, 20 min ({d})", path.parent)
    runs |= {f"cpu_{d.replace('-', '')}":
             (f"cpu, 30 min ({d})", RESULTS / f"cpu-{d}") for d in DIRECTIONS}
    return {key: (label, load_json(folder / "curve.json"))
            for key, (label, folder) in runs.items()}


# book/12_results.ipynb: Example translations
def sentence_frame(sources: list[str], references: list[str],
                   hyps: list[str]) -> pd.DataFrame:
    """One row per sentence: the texts, sentence-level sacreBLEU and word
    counts."""
    if not len(sources) == len(references) == len(hyps):
        raise ValueError(
            f"{len(sources)} sources, {len(references)} references and "
            f"{len(hyps)} hypotheses: the hypothesis file must have one line "
            f"per source sentence")
    return pd.DataFrame({
        "source": sources, "reference": references, "hypothesis": hyps,
        "bleu": [sacrebleu.sentence_bleu(h, [r]).score
                 for h, r in zip(hyps, references)],
        "hyp_words": [len(h.split()) for h in hyps],
        "ref_words": [len(r.split()) for r in references]})


def repeats(sentence: str, times: int = 3) -> bool:
    """True when some word occurs ``times`` times in a row ("einem einem
    einem")."""
    words = sentence.split()
    return any(len(set(words[i:i + times])) == 1
               for i in range(len(words) - times + 1))


ERRORS = {
    "empty output": lambda f: f["hypothesis"].str.strip() == "",
    "a word 3 times in a row": lambda f: f["hypothesis"].map(repeats),
    "under half the reference length":
        lambda f: f["hyp_words"] < 0.5 * f["ref_words"],
    "over 1.5 times the reference length":
        lambda f: f["hyp_words"] > 1.5 * f["ref_words"],
    "a broken character (U+FFFD)":
        lambda f: f["hypothesis"].str.contains("\ufffd", regex=False),
    "copies the source":
        lambda f: f["hypothesis"].str.lower() == f["source"].str.lower(),
}


def error_profile(frame: pd.DataFrame) -> pd.DataFrame:
    """How many outputs show each generic failure sign, their share and
    their mean sentence BLEU."""
    rows = []
    for name, test in ERRORS.items():
        hit = test(frame)
        bleu = frame.loc[hit, "bleu"].mean() if hit.any() else np.nan
        rows.append({"sign": name, "sentences": int(hit.sum()),
                     "share %": 100 * hit.mean(), "mean sentence BLEU": bleu})
    return pd.DataFrame(rows).set_index("sign")


# book/12_results.ipynb: The trained attention
KINDS = {  # kind -> (name, query side, key side)
    "enc_self": ("encoder self-attention", "src", "src"),
    "dec_self": ("decoder self-attention", "tgt", "tgt"),
    "cross": ("encoder-decoder attention", "tgt", "src")}
MAX_POSITIONS = 25  # an attention chart draws at most this many tokens a side


def load_attention(path) -> dict:
    """attention.npz as a dict of arrays (weights float16, tokens and
    sentences as strings)."""
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def attention_frame(att: dict, k: int, kind: str) -> pd.DataFrame:
    """Long format of one sentence's weights: one row per (layer, head,
    query, key), layers and heads from 1."""
    weights = att[f"s{k}_{kind}"].astype(np.float32)  # (N, h, len_q, len_k)
    _, q_side, k_side = KINDS[kind]
    q_tokens = att[f"s{k}_{q_side}_tokens"]
    k_tokens = att[f"s{k}_{k_side}_tokens"]
    layer, head, query, key = (a.ravel() for a in np.indices(weights.shape))
    return pd.DataFrame({"layer": layer + 1, "head": head + 1,
                         "query": query, "key": key,
                         "query_token": q_tokens[query],
                         "key_token": k_tokens[key],
                         "weight": weights.ravel()})


def attention_chart(att: dict, k: int, kind: str, cell: int = 18,
                    min_weight: float = 0.01,
                    max_positions: int = MAX_POSITIONS):
    """Heatmap of one kind of attention with layer and head selectors;
    tokens on the axes.

    Weights below ``min_weight`` are left out (drawn white, as 0 is), and
    only the first ``max_positions`` tokens of each side are drawn, so that
    every row and column keeps a readable label (a degenerate output that
    repeats one word would otherwise fill the page).
    """
    df = attention_frame(att, k, kind)
    n_layers, n_heads = int(df["layer"].max()), int(df["head"].max())
    df = df[(df["weight"] >= min_weight) & (df["query"] < max_positions)
            & (df["key"] < max_positions)]
    df = df.assign(weight=df["weight"].astype(float).round(3))
    name, q_side, k_side = KINDS[kind]
    cut = []

    def axis(field, side):
        """Encoding arguments of one axis (positions, labelled with their
        tokens) and its length in pixels."""
        all_tokens = att[f"s{k}_{side}_tokens"]
        tokens = [str(t) for t in all_tokens[:max_positions]]
        if len(all_tokens) > max_positions:
            cut.append(f"first {max_positions} of {len(all_tokens)} {field}s")
        step = max(12, min(cell, 450 // len(tokens)))
        labels = json.dumps(tokens, ensure_ascii=False)
        return dict(shorthand=f"{field}:O", title=field,
                    scale=alt.Scale(domain=list(range(len(tokens)))),
                    axis=alt.Axis(labelExpr=f"{labels}[datum.value]",
                                  labelFontSize=11, labelLimit=90,
                                  labelAngle=-60 if field == "key" else 0)
                    ), step * len(tokens)

    (x, width), (y, height) = axis("key", k_side), axis("query", q_side)
    layer = alt.param(name="layer", value=n_layers, bind=alt.binding_select(
        options=list(range(1, n_layers + 1)), name="layer "))
    head = alt.param(name="head", value=1, bind=alt.binding_select(
        options=list(range(1, n_heads + 1)), name="head "))
    title = f"{name}: sentence {k}" + (f" ({', '.join(cut)})" if cut else "")
    colour = alt.Color("weight:Q", scale=alt.Scale(
        domain=[0, 1], range=["#ffffff", "#08306b"], interpolate="rgb"))
    side = {"src": "source", "tgt": "target"}
    description = (
        f"Heatmap of the {name} weights of sentence {k}: {side[q_side]} "
        f"tokens as rows (queries), {side[k_side]} tokens as columns (keys), "
        f"darker for a larger weight; menus pick the layer and the head.")
    return alt.Chart(df, title=title).mark_rect().encode(
        x=alt.X(**x), y=alt.Y(**y), color=colour,
        tooltip=["query_token", "key_token", "weight"],
    ).add_params(layer, head).transform_filter(
        (alt.datum.layer == layer) & (alt.datum.head == head)).properties(
        width=width, height=height, description=description)


# book/12_results.ipynb: The trained attention
def head_summary(att: dict) -> pd.DataFrame:
    """Per kind of attention and layer, over the stored sentences: the
    mean entropy of a row of weights (nats; 0 = one key only) and the share
    of rows whose largest weight is on the query's own position or on the
    one before it (self-attention only) or on </s>, the source's last piece
    (when the keys are the source)."""
    rows = []
    for kind, (name, q_side, k_side) in KINDS.items():
        n_layers = att[f"s0_{kind}"].shape[0]
        for layer in range(n_layers):
            entropy, same, previous, eos, n = 0.0, 0, 0, 0, 0
            for k in range(3):
                w = att[f"s{k}_{kind}"][layer].astype(np.float64)  # (h, q, k)
                top = w.argmax(-1)  # (h, q)
                q = np.arange(w.shape[1])
                entropy += -(w * np.log(w + 1e-12)).sum(-1).sum()
                same += int((top == q).sum())
                previous += int((top == q - 1).sum())
                eos += int((top == w.shape[2] - 1).sum())
                n += top.size
            self_attention = q_side == k_side
            rows.append({"attention": name, "layer": layer + 1,
                         "entropy (nats)": entropy / n,
                         "top on own position %": 100 * same / n
                         if self_attention else np.nan,
                         "top on the previous %": 100 * previous / n
                         if self_attention else np.nan,
                         "top on </s> %": 100 * eos / n
                         if k_side == "src" else np.nan})
    return pd.DataFrame(rows).set_index(["attention", "layer"])


# book/12_results.ipynb: Speed
def train_benchmark_table(report: dict) -> pd.DataFrame:
    """benchmarks/train_throughput.py: tokens/s, ms per update, parameters
    and MFU of ours and nn.Transformer."""
    return pd.DataFrame({
        name: {"tokens/s": r["tokens_per_s"],
               "ms per update": 1e3 * r["seconds_per_step"],
               "parameters (M)": r["parameters"] / 1e6,
               "TFLOP per update": r["flops_per_step"] / 1e12,
               "MFU %": np.nan if r["mfu"] is None else 100 * r["mfu"]}
        for name, r in report["results"].items()}).T


def decode_benchmark_table(report: dict) -> pd.DataFrame:
    """benchmarks/decode_throughput.py: beam search with and without the
    key/value cache."""
    return pd.DataFrame({
        name: {"sentences/s": r["sentences_per_s"],
               "output tokens/s": r["output_tokens_per_s"],
               "seconds": r["seconds"]}
        for name, r in report["results"].items()}).T
