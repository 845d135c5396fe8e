"""Multi30k de→en, side by side: our Transformer vs PyTorch's nn.Transformer, same data, tokenizer,
batches, training-time budget and decoding; sacreBLEU on test_2016_flickr and test_2017_flickr.

    python scripts/benchmark_multi30k.py --budget 30m --threads 2 --seed 0    # -> results/multi30k/seed_0
    python scripts/benchmark_multi30k.py --budget 30m --threads 2 --seed 1    # -> results/multi30k/seed_1
    python scripts/benchmark_multi30k.py --summarize                          # -> results/multi30k/summary.json

Both models have the same architecture (pre-LN, d_model 256, 3+3 layers, shared 8k BPE, tied
embeddings) and train on the same batches of at most 2,048 padded tokens a side (about 4k tokens a
batch) with label smoothing 0.1 and the paper's warmup schedule. Ours trains through the product's
own `train_run(run, TrainSettings(...))`, the call behind `python -m transformer_lib train`, into the
run folder OUT/runs/ours (git ignores every runs/ folder), which `evaluate --run`, `translate --run`
and `translate --attention` open; model_ours.json records the `train` command that trains the same
("train_command"). The peer keeps its own small loop, on the same batches from the same tokenizer,
and that standard recipe: float32, dropout 0.1 wherever nn.Transformer puts it, and its last weights
are the model. Ours drops out the residual branches and embeddings, as the paper does, and also the
attention weights, as nn.Transformer does and the paper does not, but not the feed-forward hidden
units, which nn.Transformer drops too (--ours-attention-dropout and --ours-activation-dropout, chosen
on the validation set; the feed-forward dropout costs step time on a CPU), draws its
attention projections as nn.MultiheadAttention does (W^Q,
W^K, W^V as one packed Xavier matrix, zero biases: --ours-init torch, also chosen on the validation
set; the library's own init draws each D x D matrix alone), and adds three things: bf16 autocast where it
pays (--ours-amp auto times a few steps of both precisions on this machine first, outside the time
budget, and takes bf16 only if it is faster: it is on CPUs with fast bf16 instructions, not on
others; --ours-attention auto, the default, likewise times the fused and the explicit attention); a cooldown of the
learning rate to 0 over the last quarter of the time budget (--ours-cooldown, part of the schedule:
`make_optimizer(..., cooldown=...)` in transformer_lib.training); and the paper's
averaging of the last 5 checkpoints (§6.1, --ours-average), kept if it scores at least as high as
the last weights on the validation set. Both are scored with the same greedy decoding and beam search
(beam 4), whose length penalty α each model takes, as the paper did, from the validation set: the
candidate of --alpha (0.6, the paper's, to 2.0) whose beam search scores the highest BLEU there. The
validation set is scored greedy too, for ours before and after averaging.

--device (default cpu) is where both models train and decode, one after the other, on the same
batches and budget: e.g. `--device cuda`. There --ours-amp auto takes the precision the GPU has
(`transformer_lib.device.pick_amp`: bf16 on compute capability >= 8.0, fp16 with a GradScaler below);
the peer stays float32 unless --peer-amp says otherwise.

Reads Multi30k from --data-dir (default $MULTI30K_DIR, else ../shared/data/multi30k beside the repo).
Writes metrics.json, curves.png (training and validation loss), attention.png, samples.md and the
trained models' tokenizer into --out. For choosing a recipe, --valid-only trains and scores the
validation set only, and never looks at a test set.
"""
import argparse
import json
import math
import os
import platform
import shlex
import signal
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results" / "multi30k"      # one folder per seed, seed_0, seed_1, ..., and summary.json
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from transformer_lib.data import TranslationData, load_pairs  # noqa: E402
from transformer_lib.decoding import _check_alpha  # noqa: E402
from transformer_lib.device import faster_cpu_autocast, keep_freed_memory, pick_amp  # noqa: E402
from transformer_lib.evaluation import ALPHA_CANDIDATES, choose_alpha, score_translations, translate  # noqa: E402
from transformer_lib.files import fingerprint_tokenizer  # noqa: E402
from transformer_lib.model import TransformerConfig  # noqa: E402
from transformer_lib.options import alpha_choice, parse_duration, train_command  # noqa: E402
from transformer_lib.recipe import greedy_bleu  # noqa: E402
from transformer_lib.runs import RunError, RunFolder, one_line  # noqa: E402
from transformer_lib.settings import TrainSettings  # noqa: E402
from transformer_lib.tokenization import train_bpe_tokenizer  # noqa: E402
from transformer_lib.train_run import train_run  # noqa: E402
from transformer_lib.training import (LabelSmoothingLoss, Trainer, make_optimizer, translation_loss,  # noqa: E402
                                      validation_loss)
from peer_transformer import PeerTransformer  # noqa: E402


def recipe_for(name: str, args) -> dict:
    """What differs between the two models: only ours gets autocast, the cooldown, averaging and its own options."""
    ours = name == "ours"
    amp = args.ours_amp if ours else args.peer_amp
    dropout = args.ours_dropout if ours and args.ours_dropout is not None else args.dropout
    # Where ours has no own attention or activation dropout, it takes its dropout, as train's None does.
    attention_dropout, activation_dropout = ((dropout if rate is None else rate) if ours else None
                                             for rate in (args.ours_attention_dropout, args.ours_activation_dropout))
    return {"amp": None if amp == "none" else amp,   # "auto": decided by the device (and, on a CPU, by measuring)
            "cooldown": args.ours_cooldown if ours else 0.0,
            "lr_factor": args.ours_lr_factor if ours and args.ours_lr_factor else args.lr_factor,
            "dropout": dropout, "init": args.ours_init if ours else "torch",
            "attention": args.ours_attention if ours else "torch",
            "attention_dropout": attention_dropout, "activation_dropout": activation_dropout,
            "average_last": args.ours_average if ours else 0, "average_every": args.average_every}


RUN_FOLDER = Path("runs") / "ours"      # ours' run folder, under --out
CHECKPOINT_EVERY = 500                  # ours' checkpoints (each carries the snapshots --ours-average keeps)


def ours_settings(args) -> TrainSettings:
    """Our model's recipe as the TrainSettings that `python -m transformer_lib train` builds from its options."""
    recipe = recipe_for("ours", args)
    return TrainSettings(
        data="multi30k", data_dir=Path(args.data_dir).resolve(), vocab_size=args.vocab_size, d_model=args.d_model,
        heads=args.heads, d_ff=args.d_ff, layers=args.layers, dropout=recipe["dropout"],
        attention_dropout=args.ours_attention_dropout, activation_dropout=args.ours_activation_dropout,  # None: dropout
        label_smoothing=args.label_smoothing, max_tokens=args.max_tokens, warmup=args.warmup,
        lr_factor=recipe["lr_factor"], cooldown=recipe["cooldown"], seed=args.seed, max_steps=args.max_steps,
        time_budget=args.budget, validate_every=args.validate_every, checkpoint_every=CHECKPOINT_EVERY,
        device=args.device, amp=args.ours_amp, threads=args.threads, progress=not args.no_progress,
        init=recipe["init"], attention=recipe["attention"], average=recipe["average_last"],
        average_every=args.average_every)


def train_ours(args, tokenizer, valid_pairs: list) -> tuple[dict, nn.Module, object]:
    """Train ours with `train_run` into OUT/runs/ours (or resume it there); its result entry, and the model and
    tokenizer that `evaluate --run` loads from the folder. The tokenizer must be the peer's."""
    run, settings = args.out / RUN_FOLDER, ours_settings(args)
    summary = train_run(run, settings)
    folder = RunFolder(run).read(args.device)
    if folder.tokenizer.fingerprint != fingerprint_tokenizer(tokenizer.tokenizer.to_str()):
        _refuse(f"{run}'s tokenizer is not the one the peer trains with; train both from the same Multi30k files")
    model = folder.load_model(torch.device(args.device))
    recipe = recipe_for("ours", args) | {"amp": None if summary["amp"] == "float32" else summary["amp"],
                                         "attention": summary.get("attention", "fused"), "kept": "last_weights"}
    averaging = summary.get("averaging")
    if averaging:        # train_run kept whichever of the last and the averaged weights scored higher
        recipe.update(kept=averaging["kept"], averaged_steps=averaging["snapshots"])
    valid = averaging["valid_greedy"] if averaging else {
        "last_weights": greedy_bleu(model, folder.tokenizer, valid_pairs)}
    print(f"[ours] {summary['steps']} steps in {summary['train_seconds']:.0f}s; valid greedy: {valid}", file=sys.stderr)
    tokens = sum(h["tokens"] for h in summary["history"])
    return {"steps": summary["steps"], "train_seconds": summary["train_seconds"],
            "epochs_started": summary["epochs_started"],
            "target_tokens_per_second": round(tokens / max(summary["train_seconds"], 1e-9)),
            "parameters": summary["parameters"], "recipe": recipe, "valid_greedy": valid,
            "history": summary["history"], "run": _portable(run),
            "train_command": shlex.join(train_command(settings, _portable(run)))}, model, folder.tokenizer


def train_one(name: str, model: nn.Module, data: TranslationData, args, pad_id: int,
              valid_pairs: list, tokenizer, max_len: int) -> dict:
    """The peer's own loop: a Trainer on the batches of `data`; its last weights are the model."""
    recipe = recipe_for(name, args)
    budget, device = args.budget, torch.device(args.device)
    if recipe["amp"] == "auto" and device.type != "cpu":     # what the accelerator has (bf16, fp16 or neither)
        recipe["amp"] = pick_amp(device)
        print(f"[{name}] autocast chosen for {device}: {recipe['amp'] or 'float32'}", file=sys.stderr)
    if recipe["amp"] == "auto":      # chosen per machine, by measuring; the probe's time counts against the budget
        start = time.perf_counter()
        criterion = LabelSmoothingLoss(args.label_smoothing, ignore_index=pad_id)
        recipe["amp"], recipe["amp_probe_seconds"] = faster_cpu_autocast(
            model, data.batches(0, seed=args.seed)[:4], lambda m, b: translation_loss(m, b, criterion))
        budget -= time.perf_counter() - start
        print(f"[{name}] autocast chosen by measurement: {recipe['amp'] or 'float32'} "
              f"{recipe['amp_probe_seconds']}", file=sys.stderr)
    torch.manual_seed(args.seed)
    optimizer, scheduler = make_optimizer(model, args.d_model, args.warmup, recipe["lr_factor"],
                                          cooldown=recipe["cooldown"])
    criterion = LabelSmoothingLoss(args.label_smoothing, ignore_index=pad_id)
    loss_fn = lambda m, b: translation_loss(m, b, criterion)   # noqa: E731
    valid_batches = TranslationData(valid_pairs, tokenizer, args.max_tokens, max_len=max_len).batches(0, shuffle=False)
    trainer = Trainer(model, loss_fn, optimizer, lambda epoch: data.batches(epoch, seed=args.seed), scheduler,
                      device=device, amp_dtype=recipe["amp"], time_budget_s=budget, max_steps=args.max_steps,
                      log_every=args.log_every,
                      progress=not args.no_progress, validate=lambda m: validation_loss(m, valid_batches, loss_fn),
                      validate_every=args.validate_every)
    state = trainer.fit()
    print(f"[{name}] {state.step} steps in {state.elapsed:.0f}s", file=sys.stderr)
    tokens = sum(h["tokens"] for h in state.history)
    valid = {"last_weights": greedy_bleu(model, tokenizer, valid_pairs)}
    recipe["kept"] = "last_weights"
    print(f"[{name}] valid greedy: {valid}", file=sys.stderr)
    return {"steps": state.step, "train_seconds": round(state.elapsed, 1), "epochs_started": state.epoch + 1,
            "target_tokens_per_second": round(tokens / max(state.elapsed, 1e-9)),
            "parameters": sum(p.numel() for p in model.parameters()), "recipe": recipe,
            "valid_greedy": valid, "history": state.history}


def evaluate_one(model: nn.Module, tokenizer, test_sets: dict, beams: list[int],
                 alpha: float) -> tuple[dict, dict]:
    scores, outputs = {}, {}
    for split, pairs in test_sets.items():
        for beam in beams:
            start = time.perf_counter()
            hyps = translate(model, tokenizer, [s for s, _ in pairs], beam_size=beam, alpha=alpha)
            key = "greedy" if beam == 1 else f"beam{beam}"
            scores.setdefault(split, {})[key] = {**{k: round(v, 2) for k, v in score_translations(
                hyps, [t for _, t in pairs]).items()}, "decode_seconds": round(time.perf_counter() - start, 1)}
            outputs[(split, key)] = hyps
            print(f"  {split} {key}: {scores[split][key]}", file=sys.stderr)
    return scores, outputs


def _plot_attention(model, tokenizer, sentence: str, path: Path) -> None:
    """Cross-attention of the last decoder layer (mean over heads) while translating `sentence`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model.eval()
    hyp = translate(model, tokenizer, [sentence])[0]
    device = next(model.parameters()).device
    src = torch.tensor([tokenizer.encode(sentence, unknown="replace")], device=device)
    hyp_ids = tokenizer.encode(hyp, add_special_tokens=False, unknown="replace") if hyp.strip() else []
    tgt = torch.tensor([[tokenizer.bos_id] + hyp_ids], device=device)    # <s> y1 .. yn
    layer = model.decoder.layers[-1].cross_attn
    layer.keep_weights = True
    with torch.no_grad():
        model(src, tgt)
    layer.keep_weights = False
    weights = layer.last_weights[0].mean(0).float().cpu()                 # (T, S)
    fig, ax = plt.subplots(figsize=(7, 6))
    image = ax.imshow(weights, cmap="viridis", vmin=0)
    ax.set_xticks(range(src.size(1)), [tokenizer.id_to_token(i) for i in src[0].tolist()], rotation=90)
    ax.set_yticks(range(tgt.size(1)), [tokenizer.id_to_token(i) for i in tgt[0].tolist()])
    ax.set_xlabel("source (German) subwords"); ax.set_ylabel("target (English) subwords, input side")
    ax.set_title("Cross-attention, last decoder layer, mean of heads")
    fig.colorbar(image, ax=ax, label="attention weight")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def _plot_curves(report: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for (name, result), colour in zip(report["models"].items(), ("tab:blue", "tab:orange")):
        history, valid = result["history"], [h for h in result["history"] if "valid_loss" in h]
        for ax, x in ((left, "step"), (right, "elapsed")):
            scale = 1 if x == "step" else 1 / 60
            ax.plot([h[x] * scale for h in history], [h["loss"] for h in history], color=colour,
                    label=f"{name}, training")
            ax.plot([h[x] * scale for h in valid], [h["valid_loss"] for h in valid], "--", color=colour,
                    label=f"{name}, validation")
    left.set(title="Loss (label-smoothed) against steps", xlabel="step", ylabel="loss")
    right.set(title="Loss against training time", xlabel="training minutes", ylabel="loss")
    left.legend(); right.legend()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def alpha_candidates(text: str) -> list[float]:
    """--alpha: one α, candidates separated by commas, or auto (ALPHA_CANDIDATES), each one the beam search
    accepts (checked here, before any training)."""
    given = alpha_choice(text)
    alphas = list(ALPHA_CANDIDATES) if given == "auto" else list(given) if isinstance(given, tuple) else [given]
    try:
        for alpha in alphas:
            _check_alpha(alpha)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return alphas


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data-dir", default=os.environ.get("MULTI30K_DIR", str(ROOT.parent / "shared/data/multi30k")))
    p.add_argument("--out", type=Path, default=None, help=f"default: {RESULTS.relative_to(ROOT)}/seed_SEED")
    p.add_argument("--models", default="ours,peer", help="comma-separated: ours, peer")
    p.add_argument("--budget", type=parse_duration, default=parse_duration("30m"), help="training time per model")
    p.add_argument("--max-steps", type=int, default=None, help="also stop after this many steps (for smoke runs)")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=1024)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--max-tokens", type=int, default=2048, help="padded tokens a batch, on each side")
    p.add_argument("--warmup", type=int, default=400)
    p.add_argument("--lr-factor", type=float, default=1.0)
    p.add_argument("--device", default="cpu", help="where both models train and decode: cpu, cuda, cuda:1, mps")
    p.add_argument("--ours-amp", default="auto", choices=["auto", "bf16", "fp16", "none"],
                   help="autocast for ours; auto: on a GPU what it has (bf16 on capability >= 8.0, else fp16), on a "
                        "CPU a few timed steps of both, bf16 only if it is faster (only with fast bf16 instructions)")
    p.add_argument("--peer-amp", default="none", choices=["auto", "bf16", "fp16", "none"],
                   help="autocast for the peer (none: float32, its standard recipe); auto as for --ours-amp")
    p.add_argument("--ours-lr-factor", type=float, default=None, help="ours: --lr-factor for ours only")
    # The paper drops out only residual branches and embeddings; nn.Transformer also drops attention weights
    # and feed-forward hidden units. In 30-minute runs dropout on the attention weights alone scored highest
    # on the validation set (docs/results.md, "Raising the result"): with the feed-forward one too the
    # validation loss was lower, but so was the BLEU, and each step slower, so ours leaves it out.
    p.add_argument("--ours-dropout", type=float, default=None,
                   help="ours: dropout on residual branches and embeddings (default: --dropout, the peer's)")
    p.add_argument("--ours-attention-dropout", type=float, default=None,
                   help="ours: dropout on attention weights (0 = the paper; default: ours' --ours-dropout, "
                        "as nn.Transformer and train do)")
    p.add_argument("--ours-activation-dropout", type=float, default=0.0,
                   help="ours: dropout on feed-forward hidden units (0 = the paper, the default; nn.Transformer "
                        "and train drop them at the dropout rate)")
    p.add_argument("--ours-init", default="torch", choices=["ours", "torch"],
                   help="ours: the library's initialisation, or attention projections drawn as nn.MultiheadAttention "
                        "draws them (packed Q/K/V Xavier, zero biases)")
    p.add_argument("--ours-attention", default="auto", choices=["fused", "explicit", "auto"],
                   help="ours: the attention path its training steps take (auto: the faster of the two, timed here "
                        "on a few steps; train --attention)")
    p.add_argument("--log-every", type=int, default=25, help="the peer's steps between logged training losses "
                   "(ours logs every 10, as train does)")
    p.add_argument("--validate-every", type=int, default=100, help="steps between validation losses (a multiple of "
                   "--log-every and of 10)")
    p.add_argument("--valid-only", action="store_true",
                   help="choose a recipe: train and score the validation set only (no test set is read)")
    p.add_argument("--ours-cooldown", type=float, default=0.25,
                   help="ours: over this last share of the budget, bring the learning rate linearly down to 0")
    p.add_argument("--ours-average", type=int, default=5,
                   help="ours: average this many last snapshots (0 = use the last weights, as the peer does)")
    p.add_argument("--average-every", type=int, default=100, help="steps between the snapshots averaged")
    p.add_argument("--beams", default="1,4", help="beam sizes to evaluate (1 = greedy)")
    p.add_argument("--alpha", type=alpha_candidates, default="auto",
                   help="beam search's length penalty α, or comma-separated candidates (auto: 0.6, 0.8, ..., 2.0; "
                        "transformer_lib.evaluation.choose_alpha): each model decodes the "
                        "validation set with the widest of --beams at each and keeps the one that scores highest "
                        "(the first of equals; the paper chose its 0.6 on its development set)")
    p.add_argument("--test-limit", type=int, default=None, help="score only the first N test (and validation) "
                   "sentences (ours' run, like train, still validates and chooses its averaged weights on all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--weights-dir", type=Path, default=None, help="where trained weights are kept "
                   "(not committed; default: runs/seed_SEED)")
    p.add_argument("--eval-only", action="store_true", help="re-score weights saved by an earlier run")
    p.add_argument("--default-malloc", action="store_true", help="with --models peer only, on a CPU: leave glibc's "
                   "malloc as it is; by default the process lets it keep freed blocks for reuse, as `train` always "
                   "does on a CPU, and so for ours (transformer_lib.device.keep_freed_memory)")
    p.add_argument("--assemble", action="store_true", help="train and decode nothing: rebuild --out's metrics.json, "
                   "curves.png and samples.md from its model_*.json, after a model's files were copied in from a run "
                   "made with another --out (ours' run folder into OUT/runs/ours)")
    p.add_argument("--summarize", action="store_true", help=f"train nothing: write {RESULTS.relative_to(ROOT)}/"
                   "summary.json, each model's scores per seed and their mean, from every seed_*/metrics.json there")
    return p


def shared_data(args) -> tuple:
    """What both models share: the pairs, the tokenizer, the architecture and the peer's batches, built as
    `train_run` builds ours' (a test checks that their token ids are equal). The BPE training is
    deterministic, so separate processes (one per model) share one vocabulary."""
    train_pairs = load_pairs("multi30k", "train", data_dir=args.data_dir)
    test_sets = {} if args.valid_only else {
        split: load_pairs("multi30k", split, data_dir=args.data_dir, limit=args.test_limit)
        for split in ("test_2016", "test_2017")}
    valid_pairs = load_pairs("multi30k", "valid", data_dir=args.data_dir, limit=args.test_limit)
    tokenizer = train_bpe_tokenizer([s for pair in train_pairs for s in pair], vocab_size=args.vocab_size)
    config = TransformerConfig(tokenizer.vocab_size, tokenizer.vocab_size, args.d_model, args.heads, args.d_ff,
                               args.layers, args.layers, args.dropout, norm_first=True, pad_id=tokenizer.pad_id)
    data = TranslationData(train_pairs, tokenizer, args.max_tokens, max_len=config.max_len)
    return train_pairs, valid_pairs, test_sets, tokenizer, config, data


def main() -> None:
    args = build_parser().parse_args()
    _check_device(args.device)
    if torch.device(args.device).type != "cuda" and "fp16" in (args.ours_amp, args.peer_amp):
        _refuse(f"fp16 autocast (with its GradScaler) needs a CUDA device, not --device {args.device}; use bf16 or none")
    if args.summarize:
        print(json.dumps(summarize(RESULTS), indent=1))
        return
    if args.default_malloc and "ours" in args.models.split(","):
        _refuse("--default-malloc needs --models peer: ours trains through `train`, which lets malloc keep freed "
                "memory on a CPU")
    if args.assemble and (args.valid_only or args.eval_only):
        _refuse("--assemble rebuilds a run's test-set record: leave out --valid-only and --eval-only")
    args.out = args.out or RESULTS / f"seed_{args.seed}"
    args.weights_dir = args.weights_dir or ROOT / "runs" / f"seed_{args.seed}"
    if args.threads:
        torch.set_num_threads(args.threads)
    # For both models alike, before either trains: on a CPU, freed blocks are reused, not mapped afresh each step
    # (`train` does the same for its runs on a CPU).
    args.malloc_keeps_freed = torch.device(args.device).type == "cpu" and not args.default_malloc and keep_freed_memory()
    args.out.mkdir(parents=True, exist_ok=True)
    train_pairs, valid_pairs, test_sets, tokenizer, config, data = shared_data(args)
    tokenizer.save(args.out / "tokenizer.json")
    if args.assemble:
        assemble_copied_runs(args.out, train_pairs, test_sets, tokenizer)
        return
    beams = [int(b) for b in args.beams.split(",")]
    for name in args.models.split(","):
        weights, model_tokenizer = args.weights_dir / f"multi30k_{name}.pt", tokenizer    # the peer's weights
        if args.eval_only:   # re-score saved weights (e.g. after a decoding change), keep the training record
            if name == "ours":           # its run folder, as `evaluate --run` opens it
                folder = RunFolder(args.out / RUN_FOLDER).read(args.device)
                model, model_tokenizer = folder.load_model(torch.device(args.device)), folder.tokenizer
            else:
                model = PeerTransformer(config).to(args.device)
                model.load_state_dict(torch.load(weights, map_location=args.device, weights_only=True))
            result = json.loads((args.out / f"model_{name}.json").read_text())
            if name == "ours":
                _record_moved_run(result, args.out)
            result["eval_command"] = "python scripts/benchmark_multi30k.py " + " ".join(sys.argv[1:])
            result.setdefault("recipe", recipe_for(name, args))
            if "valid_greedy" not in result and not result["recipe"]["average_last"]:
                result["valid_greedy"] = {"last_weights": greedy_bleu(model, model_tokenizer, valid_pairs)}  # = saved
        else:
            if name == "ours":
                result, model, model_tokenizer = train_ours(args, tokenizer, valid_pairs)
            else:
                torch.manual_seed(args.seed)
                model = PeerTransformer(config).to(args.device)   # drawn on the CPU: the same start on every device
                result = train_one(name, model, data, args, tokenizer.pad_id, valid_pairs, tokenizer, config.max_len)
                weights.parent.mkdir(parents=True, exist_ok=True)
                torch.save(model.state_dict(), weights)        # runs/ is not committed
            result.update(command="python scripts/benchmark_multi30k.py " + " ".join(sys.argv[1:]),
                          hardware={**_hardware(args.device), "malloc_keeps_freed": args.malloc_keeps_freed},
                          config={k: _portable(v) for k, v in vars(args).items()} | {"model": vars(config)})
            if args.valid_only:
                (args.out / f"model_{name}.json").write_text(json.dumps(result, indent=1))
                continue
        result["length_penalty"] = choose_alpha(model, model_tokenizer, valid_pairs, max(beams), args.alpha,
                                                report=lambda line: print(f"  valid {line}", file=sys.stderr))
        scores, outputs = evaluate_one(model, model_tokenizer, test_sets, beams, result["length_penalty"]["alpha"])
        result["test"] = scores
        (args.out / f"model_{name}.json").write_text(json.dumps(result, indent=1))
        # Only our outputs are committed (one per line); the test data stays out of the repo.
        for (split, decoding), hypotheses in outputs.items():
            (args.out / f"hypotheses_{name}_{split}_{decoding}.txt").write_text("\n".join(hypotheses) + "\n")
        if name == "ours":
            _plot_attention(model, model_tokenizer, test_sets["test_2016"][0][0], args.out / "attention.png")
    if args.valid_only:
        return
    report = _assemble(args.out, train_pairs, test_sets, tokenizer)
    print(json.dumps({n: {"steps": m["steps"], "test": m["test"]} for n, m in report["models"].items()}, indent=1))


def _record_moved_run(result: dict, out: Path) -> None:
    """Ours' run folder copied to OUT/runs/ours from where it trained: record where it is now."""
    moved = _portable(out / RUN_FOLDER)
    if result.get("run") not in (None, moved):
        result["train_command"] = result["train_command"].replace(shlex.quote(result["run"]), shlex.quote(moved))
        result["run"] = moved


def assemble_copied_runs(out: Path, train_pairs, test_sets, tokenizer) -> dict:
    """--assemble: OUT's metrics.json, curves and samples from its model_*.json, as a run writes them, after
    a model's files (and ours' run folder) were copied in from a run with another --out; decodes nothing."""
    ours = out / "model_ours.json"
    if ours.is_file():
        result = json.loads(ours.read_text())
        _record_moved_run(result, out)
        ours.write_text(json.dumps(result, indent=1))
    return _assemble(out, train_pairs, test_sets, tokenizer)


def seed_scores(result: dict) -> dict:
    """One model's numbers of one run (a model entry of metrics.json), flat: what the summary compares."""
    kept = result["recipe"].get("kept", "last_weights")
    penalty = result.get("length_penalty", {"alpha": 0.6, "valid_bleu": {}})   # runs scored before the choice
    return {"steps": result["steps"], "target_tokens_per_second": result["target_tokens_per_second"],
            "valid_greedy": result["valid_greedy"][kept]["bleu"],
            "valid_beam4": penalty["valid_bleu"].get(f"{penalty['alpha']:g}")      # None: no α was chosen with beam 4
            if penalty.get("beam", 4) == 4 else None,
            "beam4_alpha": penalty["alpha"],
            **{f"{split}_{decoding}": result["test"][split][decoding]["bleu"]
               for split in ("test_2016", "test_2017") for decoding in ("greedy", "beam4")}}


def summarize(results: Path) -> dict:
    """summary.json from every results/seed_*/metrics.json: each model's scores per seed, and their mean."""
    reports = {int(p.parent.name.removeprefix("seed_")): json.loads(p.read_text())
               for p in sorted(results.glob("seed_*/metrics.json"))}
    if not reports:
        raise SystemExit(f"no {results}/seed_*/metrics.json: run the benchmark with --seed 0 and --seed 1 first")
    models = {}
    for name in ("ours", "peer"):
        per_seed = {seed: seed_scores(r["models"][name]) for seed, r in reports.items() if name in r["models"]}
        mean = {key: round(statistics.fmean(s[key] for s in per_seed.values()), 2)
                for key in next(iter(per_seed.values()))
                if all(s[key] is not None for s in per_seed.values())} if per_seed else {}
        models[name] = {"per_seed": per_seed, "mean": mean}
    summary = {"task": "Multi30k de->en, sacreBLEU BLEU (cased, 13a); the mean of the seeds run",
               "seeds": sorted(reports), "models": models}
    (results / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _portable(value):
    """A path as recorded in metrics.json: relative to the repository where it lies inside it."""
    if not isinstance(value, Path):
        return value
    return str(value.resolve().relative_to(ROOT)) if value.resolve().is_relative_to(ROOT) else str(value)


def _cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _check_device(name: str) -> None:
    """One `error:` line and exit 2 for a --device this machine cannot use."""
    try:
        device = torch.device(name)
    except RuntimeError:
        _refuse(f"--device {name!r} is not a device; use cpu, cuda, cuda:N or mps")
    if device.type == "cuda" and not torch.cuda.is_available():
        _refuse(f"--device {name}: no CUDA device is visible here (torch {torch.__version__}); use --device cpu")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        _refuse(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        _refuse(f"--device {name}: MPS is not available here; use --device cpu")


def _refuse(message: str):
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _hardware(device: str = "cpu") -> dict:
    hardware = {"machine": platform.machine(), "processor": _cpu_name(),
                "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                "torch": torch.__version__, "python": platform.python_version(), "device": device}
    if torch.device(device).type == "cuda":
        hardware.update(gpu=torch.cuda.get_device_name(device), cuda=torch.version.cuda,
                        capability=".".join(map(str, torch.cuda.get_device_capability(device))))
    return hardware


def _assemble(out: Path, train_pairs, test_sets, tokenizer) -> dict:
    """metrics.json and curves.png from every model_*.json in `out` (models may train in separate processes)."""
    models = {p.stem.removeprefix("model_"): json.loads(p.read_text()) for p in sorted(out.glob("model_*.json"))}
    report = {"task": "Multi30k de->en, sacreBLEU (cased, detokenized 13a) on the full test sets",
              "data": {"train_pairs": len(train_pairs), **{f"{k}_pairs": len(v) for k, v in test_sets.items()},
                       "vocab_size": tokenizer.vocab_size, "shared_vocabulary": True},
              "models": models}
    (out / "metrics.json").write_text(json.dumps(report, indent=1))
    _plot_curves(report, out / "curves.png")
    _write_samples(out, test_sets["test_2016"], models)
    return report


def _write_samples(out: Path, pairs, models: dict, rows=(0, 1, 2, 3, 100, 250, 500, 750)) -> None:
    """A few test_2016 translations side by side (quoting a handful of test sentences, not the set)."""
    hyps = {name: (out / f"hypotheses_{name}_test_2016_greedy.txt").read_text().splitlines() for name in models}
    lines = ["# Sample translations, test_2016_flickr, greedy", ""]
    for i in rows:
        if i < len(pairs):
            lines += [f"**{i}.** de: {pairs[i][0]}", f"- reference: {pairs[i][1]}"]
            lines += [f"- {name}: {hyps[name][i]}" for name in hyps] + [""]
    (out / "samples.md").write_text("\n".join(lines))


def run_script() -> None:
    """`main` with its endings said in one line: a refused run folder (exit 2), or Ctrl-C (exit 128 + the
    signal; also a kill while ours trains, which train_run catches), after which the same command resumes ours
    from the step it saved."""
    try:
        main()
    except RunError as error:        # ours' run folder refused (another recipe in it, a damaged file): one line
        _refuse(one_line(error))
    except KeyboardInterrupt as stop:
        again = shlex.join([sys.executable, *sys.argv])
        run = getattr(stop, "run", None)             # set where train_run saved ours at the step it stopped
        print(stop.message(run, again) if run else f"interrupted; run the same command to start again: {again}",
              file=sys.stderr)
        raise SystemExit(128 + getattr(stop, "signum", signal.SIGINT))


if __name__ == "__main__":
    run_script()
