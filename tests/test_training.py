"""§5.2–5.4: schedule, label smoothing, accumulation, precision, resume, non-finite gradients, DDP, the copy task."""

import math

import pytest
import torch
import torch.multiprocessing as mp
from torch.optim.optimizer import register_optimizer_step_pre_hook

from aiayn.model import TransformerConfig, make_model
from aiayn.batching import EpochBatches
from aiayn.training import (
    COPY_MODEL,
    COPY_TRAIN,
    CheckpointError,
    LabelSmoothingLoss,
    Progress,
    Run,
    TrainConfig,
    checkpoints,
    choose_precision,
    copy_batches,
    copy_task_data,
    greedy,
    make_optimizer,
    make_scaler,
    rate,
    read_checkpoint,
    train,
)

TINY = TransformerConfig(vocab_size=14, N=1, d_model=32, d_ff=64, h=2, P_drop=0.0, max_len=32)
QUIET = dict(progress=False, log=False)


def tiny(config=TINY, seed=0):
    torch.manual_seed(seed)
    return make_model(config)


def weights_equal(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


# --- §5.3 schedule and optimizer ---------------------------------------------------------------------------------


def test_rate_at_warmup_is_the_peak():
    assert rate(4000, 512, 4000) == pytest.approx(512**-0.5 * 4000**-0.5, rel=1e-12)
    assert rate(1, 512, 4000) == pytest.approx(512**-0.5 * 4000**-1.5, rel=1e-12)
    assert rate(16000, 512, 4000) == pytest.approx(512**-0.5 * 16000**-0.5, rel=1e-12)
    assert rate(2000, 256, 2000, factor=1.5) == pytest.approx(1.5 * 256**-0.5 * 2000**-0.5, rel=1e-12)
    with pytest.raises(ValueError, match="from 1"):
        rate(0, 512, 4000)


def test_optimizer_is_the_papers_adam():
    optimizer, scheduler = make_optimizer(tiny(), d_model=512, warmup=4000)
    group = optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9
    lrs = []
    for _ in range(3):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert lrs == [rate(n, 512, 4000) for n in (1, 2, 3)]


def test_schedule_steps_once_per_update_with_accumulation():
    data = copy_batches(6, 4, 5, 14, seed=0)
    history = train(tiny(), data, cfg=TrainConfig(warmup=10, accum=3, **QUIET))
    assert history["step"] == [1, 2]
    assert history["lr"] == [rate(1, 32, 10), rate(2, 32, 10)]


def test_the_attention_setting_chooses_equation_1s_route_in_training():
    """attention="written": every attention layer writes Equation (1) out, and the losses are the fused kernel's, to
    rounding; a setting that is neither is refused before training."""
    data = copy_batches(4, 4, 5, 14, seed=0)
    fused, written = tiny(), tiny()
    losses = train(fused, data, cfg=TrainConfig(warmup=10, max_updates=4, **QUIET))["loss"]
    again = train(written, data, cfg=TrainConfig(warmup=10, max_updates=4, attention="written", **QUIET))["loss"]
    layers = [m for m in written.modules() if hasattr(m, "fused")]
    assert layers and not any(m.fused for m in layers) and all(m.fused for m in fused.modules() if hasattr(m, "fused"))
    assert len(losses) == 4 and again == pytest.approx(losses, rel=1e-4)
    with pytest.raises(ValueError, match="'fused' or 'written'"):
        train(tiny(), data, cfg=TrainConfig(attention="flash", **QUIET))


def test_the_adam_setting_chooses_its_step_and_the_updates_agree():
    """adam="loop": Adam steps through PyTorch's loop over the parameters, not its fused kernel; on the same gradients
    the two steps give the same weights, to rounding; a setting that is neither is refused before training."""
    assert Run(tiny(), TrainConfig(**QUIET)).optimizer.defaults["fused"]
    assert not Run(tiny(), TrainConfig(adam="loop", **QUIET)).optimizer.defaults["fused"]
    fused, loop = tiny(), tiny()
    steps = [make_optimizer(m, 32, 10, fused=f)[0] for m, f in ((fused, True), (loop, False))]
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=generator) for p in fused.parameters()]
        for model, optimizer in zip((fused, loop), steps):
            for p, g in zip(model.parameters(), grads):
                p.grad = g.clone()
            optimizer.step()
    for a, b in zip(fused.parameters(), loop.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="'fused' or 'loop'"):
        train(tiny(), copy_batches(4, 4, 5, 14, seed=0), cfg=TrainConfig(adam="foreach", **QUIET))


def _first_update_gradient(model, batches, accum):
    """The gradient the optimizer sees at the loop's first update (captured by a global step hook)."""
    seen = []
    hook = register_optimizer_step_pre_hook(
        lambda opt, args, kwargs: seen.append([p.grad.clone() for p in opt.param_groups[0]["params"]])
    )
    try:
        train(model, batches, cfg=TrainConfig(warmup=10, accum=accum, max_updates=1, **QUIET))
    finally:
        hook.remove()
    return seen[0]


def test_accumulation_equals_one_big_batch():
    """3 micro-batches, each loss divided by the tokens of the whole update == one batch of their concatenation."""
    data = copy_batches(3, 4, 5, 14, seed=0)
    big = [tuple(torch.cat(parts) for parts in zip(*data))]
    for g, h in zip(_first_update_gradient(tiny(), data, 3), _first_update_gradient(tiny(), big, 1)):
        torch.testing.assert_close(g, h, rtol=0, atol=1e-6)


# --- §5.4 label smoothing ----------------------------------------------------------------------------------------


def test_label_smoothing_by_hand():
    logits = torch.tensor([[[0.0, 1.0, 2.0, 3.0], [5.0, 0.0, 0.0, 0.0]]])  # second position is padding
    target = torch.tensor([[3, 0]])
    log_z = math.log(sum(math.exp(k) for k in range(4)))
    by_hand = -(0.9 * (3 - log_z) + 0.05 * ((1 - log_z) + (2 - log_z)))  # 0.1 over the V - 2 = 2 others
    assert LabelSmoothingLoss(0.1, 0)(logits, target).item() == pytest.approx(by_hand, abs=1e-6)
    assert by_hand == pytest.approx(0.590190, abs=1e-6)


def test_smoothed_target_distribution():
    q = LabelSmoothingLoss(0.1, 0).target_distribution(torch.tensor([5, 3, 0]), V=10)
    assert q[0].tolist() == pytest.approx([0, 0.0125, 0.0125, 0.0125, 0.0125, 0.9, 0.0125, 0.0125, 0.0125, 0.0125])
    assert q[:2].sum(-1).tolist() == pytest.approx([1.0, 1.0])
    assert q[2].abs().sum().item() == 0.0  # padding row
    assert (q[:, 0] == 0).all()


def test_label_smoothing_is_finite_at_extreme_confidence():
    logits = torch.tensor([[[-1e4, 1e4, -1e4, -1e4], [-1e4, -1e4, 1e4, -1e4]]])
    loss = LabelSmoothingLoss(0.1, 0)(logits, torch.tensor([[1, 1]]))
    assert torch.isfinite(loss)


def test_without_smoothing_it_is_cross_entropy():
    torch.manual_seed(0)
    logits, target = torch.randn(2, 5, 12), torch.randint(1, 12, (2, 5))
    target[0, 3:] = 0
    expected = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), target.flatten(), ignore_index=0, reduction="sum"
    )
    torch.testing.assert_close(LabelSmoothingLoss(0.0, 0)(logits, target), expected)


# --- the loop: resume, checkpoints, stops --------------------------------------------------------------------------


def test_resume_gives_identical_weights(tmp_path):
    config = TINY.replace(P_drop=0.1)  # dropout on: the RNG states must be restored too
    data = copy_batches(8, 4, 6, 14, seed=0)  # 8 micro-batches, accum 2: 4 updates per epoch
    cfg = dict(warmup=10, epochs=4, accum=2, **QUIET)
    straight = tiny(config)
    train(straight, data, cfg=TrainConfig(**cfg, max_updates=10))
    first = tiny(config)
    train(first, data, cfg=TrainConfig(**cfg, max_updates=5, ckpt_dir=str(tmp_path)))  # stops mid-epoch 2
    assert read_checkpoint(checkpoints(tmp_path)[-1])["progress"]["batch"] == 2
    resumed = tiny(config, seed=123)  # new objects, different initial weights
    train(resumed, data, cfg=TrainConfig(**cfg, max_updates=10, ckpt_dir=str(tmp_path)), resume=True)
    assert weights_equal(straight, resumed)
    assert not weights_equal(straight, first)


def test_keeps_the_last_k_checkpoints(tmp_path):
    train(
        tiny(),
        copy_batches(6, 4, 5, 14),
        cfg=TrainConfig(warmup=10, save_every=1, keep_last=2, ckpt_dir=str(tmp_path), **QUIET),
    )
    assert [p.name for p in checkpoints(tmp_path)] == ["step_00000005.pt", "step_00000006.pt"]
    assert not list(tmp_path.glob(".*tmp*"))  # no temporary files left behind


def test_checkpoint_holds_everything(tmp_path):
    train(tiny(), copy_batches(2, 4, 5, 14), cfg=TrainConfig(warmup=10, ckpt_dir=str(tmp_path), **QUIET))
    state = read_checkpoint(checkpoints(tmp_path)[-1], TINY)
    assert {"model", "optimizer", "scheduler", "rng", "progress", "model_config"} <= set(state)
    assert {"python", "torch"} <= set(state["rng"][0])
    assert state["progress"]["epoch"] == 1 and state["progress"]["step"] == 2
    assert state["scheduler"]["last_epoch"] == 2
    # the loop's progress is a dataclass, stored as plain data: it reads back as one
    progress = Progress(**state["progress"])
    assert (progress.step, progress.batch, progress.stopped_by) == (2, 0, "epochs")
    assert progress.history["step"] == [1, 2] and len(progress.history["val_loss"]) == 0


def test_mismatched_checkpoint_is_named(tmp_path):
    train(tiny(), copy_batches(2, 4, 5, 14), cfg=TrainConfig(warmup=10, ckpt_dir=str(tmp_path), **QUIET))
    with pytest.raises(CheckpointError, match=r"different model: d_model=32 there but 64 here"):
        train(
            tiny(TINY.replace(d_model=64)),
            copy_batches(2, 4, 5, 14),
            cfg=TrainConfig(warmup=10, ckpt_dir=str(tmp_path), **QUIET),
            resume=True,
        )


def test_corrupt_checkpoint_is_named(tmp_path):
    train(tiny(), copy_batches(2, 4, 5, 14), cfg=TrainConfig(warmup=10, ckpt_dir=str(tmp_path), **QUIET))
    path = checkpoints(tmp_path)[-1]
    path.write_bytes(path.read_bytes()[:500])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        read_checkpoint(path)
    torch.save({"weights": 1}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a training checkpoint"):
        read_checkpoint(tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        read_checkpoint(tmp_path / "missing.pt")


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_a_nan_loss_stops_the_run_before_any_weight_changes():
    model = tiny()
    with torch.no_grad():
        model.generator.weight[0, 0] = float("nan")
    before = _state(model)
    with pytest.raises(FloatingPointError, match=r"not finite between updates 1 and 1 .*skipped, so no weights"):
        train(model, copy_batches(2, 4, 5, 14), cfg=TrainConfig(warmup=10, log_every=1, **QUIET))
    assert all(torch.allclose(before[k], v, rtol=0, atol=0, equal_nan=True) for k, v in model.state_dict().items())


@pytest.mark.parametrize("log_every", [1, 50])
def test_a_nan_gradient_is_never_applied_nor_checkpointed(tmp_path, log_every):
    """A finite loss with a NaN gradient at update 3: the update is skipped, the run stops, and the error names the
    newest checkpoint (update 2), whose weights are finite. Reading every 50 updates finds it before the next save."""
    model = tiny()
    seen = {"backward": 0}

    def poison(grad):
        seen["backward"] += 1
        return torch.full_like(grad, float("nan")) if seen["backward"] == 3 else grad

    model.encoder.layers[0].self_attn.W_Q.weight.register_hook(poison)  # used once per forward pass
    cfg = TrainConfig(warmup=10, save_every=1, ckpt_dir=str(tmp_path), log_every=log_every, **QUIET)
    with pytest.raises(FloatingPointError, match=r"step_00000002\.pt, the newest checkpoint, whose weights are finite"):
        train(model, copy_batches(6, 4, 5, 14), cfg=cfg)
    assert [p.name for p in checkpoints(tmp_path)] == ["step_00000001.pt", "step_00000002.pt"]
    newest = read_checkpoint(checkpoints(tmp_path)[-1])["model"]
    assert all(t.isfinite().all() for t in newest.values())
    assert all(p.isfinite().all() for p in model.parameters())
    if log_every == 1:  # read right after the skipped update: the weights are still those of update 2
        assert all(torch.equal(newest[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize(
    "device, capability, expected",
    [
        ("cpu", None, "fp32"),
        ("cuda", (7, 0), "fp16"),
        ("cuda", (7, 5), "fp16"),
        ("cuda", (8, 0), "bf16"),
        ("cuda", (8, 9), "bf16"),
        ("cuda", (9, 0), "bf16"),
    ],
)
def test_precision_follows_the_hardware(device, capability, expected):
    """bf16 from compute capability 8.0 (A100, H100), fp16 with loss scaling below (V100, T4), fp32 on a CPU."""
    assert choose_precision(device, capability=capability) == expected


def test_an_explicit_precision_is_kept_and_a_wrong_one_refused():
    assert choose_precision("cpu", "fp16") == "fp16" and choose_precision("cuda", "fp32", (9, 0)) == "fp32"
    with pytest.raises(ValueError, match="'auto', 'bf16', 'fp16' or 'fp32'"):
        choose_precision("cpu", "fp8")
    assert make_scaler("fp16", "cpu").get_scale() == 2.0**16  # fp16 gradients need scaling up
    assert make_scaler("bf16", "cpu").get_scale() == make_scaler("fp32", "cpu").get_scale() == 1.0


def test_fp16_training_runs_with_loss_scaling():
    history = train(tiny(), copy_batches(6, 4, 5, 14), cfg=TrainConfig(warmup=10, precision="fp16", **QUIET))
    assert len(history["loss"]) == 6 and all(math.isfinite(x) for x in history["loss"])


def test_no_batches_and_resume_without_a_folder_are_clear_errors():
    with pytest.raises(ValueError, match="epoch 1 has 0 batches.*not empty"):
        train(tiny(), [], cfg=TrainConfig(**QUIET))
    with pytest.raises(ValueError, match="cfg.ckpt_dir is not set"):
        train(tiny(), copy_batches(2, 4, 5, 14), cfg=TrainConfig(**QUIET), resume=True)


def test_resuming_a_finished_run_says_so(tmp_path, capsys):
    cfg = TrainConfig(warmup=10, epochs=1, ckpt_dir=str(tmp_path), progress=False)
    history = train(tiny(), copy_batches(2, 4, 5, 14), cfg=cfg)
    capsys.readouterr()
    again = train(tiny(seed=7), copy_batches(2, 4, 5, 14), cfg=cfg, resume=True)
    assert "the run is finished (2 updates, 1 epochs): nothing to train" in capsys.readouterr().out
    assert again == history and history["stopped_by"] == "epochs"


def test_the_loop_reads_from_the_device_only_at_its_read_points(monkeypatch):
    """Host reads (item, tolist, int, float, bool of a tensor) do not grow with the number of updates: the losses stay
    on the device until a read, and token counts come with the batches (aiayn.batching.Batch)."""
    pairs = [([5 + i % 7] * (3 + i % 5), [6 + i % 5] * (4 + i % 3)) for i in range(400)]
    batches = EpochBatches(pairs, max_tokens=120, seed=0)

    def reads(updates):
        count = {"n": 0}
        for name in ("item", "tolist", "__int__", "__float__", "__bool__"):
            original = getattr(torch.Tensor, name)

            def counting(self, *args, _original=original, **kwargs):
                count["n"] += 1
                return _original(self, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counting)
        try:
            history = train(tiny(), batches, cfg=TrainConfig(warmup=10, max_updates=updates, log_every=1000, **QUIET))
        finally:
            monkeypatch.undo()
        assert len(history["loss"]) == updates
        return count["n"]

    assert len(batches) > 40
    assert reads(10) == reads(40)


def test_early_stopping():
    """With a learning rate of 0 the validation loss never improves: the run stops after 1 + patience epochs."""
    data, val = copy_batches(2, 4, 5, 14, seed=0), copy_batches(1, 4, 5, 14, seed=1)
    history = train(tiny(), data, val, TrainConfig(warmup=1, factor=0.0, epochs=50, patience=2, **QUIET))
    assert len(history["val_loss"]) == 3 and len(set(history["val_loss"])) == 1
    assert history["stopped_by"] == "patience"


# --- DDP on CPU with gloo -----------------------------------------------------------------------------------------


def _ddp_worker(rank, world_size, init_file, out):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    model = tiny()
    train(model, copy_batches(8, 4, 6, 14, seed=0), cfg=TrainConfig(warmup=4, epochs=2, **QUIET))
    if rank == 0:
        torch.save(model.state_dict(), out)
    dist.destroy_process_group()


def test_ddp_two_processes_match_one(tmp_path):
    """2 gloo processes, one micro-batch each == 1 process accumulating both (same global batch), to 1e-6."""
    out = tmp_path / "ddp.pt"
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "init"), str(out)), nprocs=2, join=True)
    single = tiny()
    train(single, copy_batches(8, 4, 6, 14, seed=0), cfg=TrainConfig(warmup=4, epochs=2, accum=2, **QUIET))
    ddp = torch.load(out)
    for name, value in single.state_dict().items():
        torch.testing.assert_close(ddp[name], value, rtol=0, atol=1e-6, msg=name)


# --- the copy task and the command line ---------------------------------------------------------------------------


def test_copy_task_decodes_exactly():
    train_data, val_data = copy_task_data()
    torch.manual_seed(0)
    model = make_model(TransformerConfig(**COPY_MODEL))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small gains nothing from more threads, and one is robust to a busy machine
    try:
        train(model, train_data, val_data, TrainConfig(**COPY_TRAIN, **QUIET))
    finally:
        torch.set_num_threads(threads)
    src = copy_batches(1, 8, 10, COPY_MODEL["vocab_size"], seed=3)[0][0]
    assert greedy(model, src, max_len=12) == src.tolist()


def test_max_seconds_stops_and_saves_then_resume_continues(tmp_path):
    data = copy_batches(20, 8, 10, 14)
    train(tiny(), data[:1], cfg=TrainConfig(max_updates=1, **QUIET))  # first-call costs out of the way
    cfg = TrainConfig(warmup=20, epochs=10**6, max_seconds=1.0, ckpt_dir=str(tmp_path), **QUIET)
    history = train(tiny(), data, cfg=cfg)
    assert 0 < history["step"][-1] < 20 * 10**6
    last = read_checkpoint(checkpoints(tmp_path)[-1])
    assert last["progress"]["step"] == history["step"][-1]  # saved where it stopped
    assert history["stopped_by"] == last["progress"]["stopped_by"] == "max_seconds"  # and why
    more = train(
        tiny(),
        data,
        cfg=TrainConfig(warmup=20, epochs=10**6, max_updates=history["step"][-1] + 3, ckpt_dir=str(tmp_path), **QUIET),
        resume=True,
    )
    assert more["step"][-4:] == [history["step"][-1] + i for i in range(4)]
    assert more["stopped_by"] == "max_updates"


def test_compile_takes_the_loss_with_the_model():
    """compile=True: the step's model and its label-smoothed loss (which passes over the batch × length × vocabulary
    of logits) are both compiled, and the loss keeps what evaluation reads from it; without it neither is."""
    compiled = Run(tiny(), TrainConfig(compile=True, **QUIET))
    assert isinstance(compiled.net, torch._dynamo.eval_frame.OptimizedModule)
    assert isinstance(compiled.loss_fn, torch._dynamo.eval_frame.OptimizedModule)
    assert compiled.loss_fn.pad_id == 0 and compiled.loss_fn.eps_ls == pytest.approx(0.1)
    eager = Run(tiny(), TrainConfig(**QUIET))
    assert isinstance(eager.loss_fn, LabelSmoothingLoss) and eager.net is eager.model
