"""Command line for the course: `python -m transformer_lib {train,translate,evaluate} --help`.

Hand-written (no notebook is its home): it wires the notebooks' exported pieces together, the
same code the notebooks run. A run folder holds config.json, tokenizer.json, checkpoint.pt
(resumable; written atomically) and history.json.
"""
import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from transformer_lib.data import TranslationData, load_pairs
from transformer_lib.device import pick_device
from transformer_lib.evaluation import score_translations, translate
from transformer_lib.model import TransformerConfig, build_transformer
from transformer_lib.tokenization import SubwordTokenizer, train_bpe_tokenizer
from transformer_lib.training import (LabelSmoothingLoss, Trainer, checkpoint_callback, load_checkpoint,
                                      make_optimizer, save_checkpoint, translation_loss)


def parse_duration(text: str) -> float:
    """'90', '90s', '25m' or '1.5h' -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        if text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (use e.g. 90s, 25m, 1.5h)") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m transformer_lib", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train a model; resumes if the run folder has a checkpoint",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    train.add_argument("--run", type=Path, required=True, help="run folder for checkpoint, tokenizer, config, history")
    train.add_argument("--data", default="builtin", choices=["builtin", "multi30k", "opus_books"], help="corpus")
    train.add_argument("--data-dir", default=None, help="local Multi30k folder (default: $MULTI30K_DIR, else the Hub)")
    train.add_argument("--src-lang", default=None, help="source language (multi30k: de, opus_books: en)")
    train.add_argument("--tgt-lang", default=None, help="target language (multi30k: en, opus_books: it)")
    train.add_argument("--vocab-size", type=int, default=1000, help="shared BPE vocabulary size")
    train.add_argument("--d-model", type=int, default=128, help="model width")
    train.add_argument("--heads", type=int, default=4, help="attention heads")
    train.add_argument("--d-ff", type=int, default=512, help="feed-forward hidden width")
    train.add_argument("--layers", type=int, default=2, help="encoder layers and decoder layers (each)")
    train.add_argument("--dropout", type=float, default=0.1, help="dropout probability")
    train.add_argument("--post-ln", action="store_true", help="post-LN as in the paper (default: pre-LN)")
    train.add_argument("--label-smoothing", type=float, default=0.1, help="label smoothing ε")
    train.add_argument("--max-tokens", type=int, default=4096, help="padded tokens per batch")
    train.add_argument("--warmup", type=int, default=400, help="warmup steps of the inverse-sqrt schedule")
    train.add_argument("--lr-factor", type=float, default=1.0, help="multiplies the paper's learning rate")
    train.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    train.add_argument("--time-budget", type=parse_duration, default=None, help="stop after this much training time (25m)")
    train.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints")
    train.add_argument("--seed", type=int, default=0, help="random seed (data order, init, dropout)")
    train.add_argument("--device", default=None, help="cuda, mps or cpu (default: the best present)")
    train.add_argument("--amp", default=None, choices=["bf16", "fp16"],
                       help="mixed precision: bf16 on CUDA or on a CPU with bf16 instructions, fp16 on CUDA only")
    train.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    for name, text in (("translate", "translate sentences (arguments, or one per line on stdin)"),
                       ("evaluate", "score a trained model on a test split with sacreBLEU")):
        sub = commands.add_parser(name, help=text, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        sub.add_argument("--run", type=Path, required=True, help="run folder written by `train`")
        sub.add_argument("--beam", type=int, default=1, help="beam size (1 = greedy)")
        sub.add_argument("--alpha", type=float, default=0.6, help="length penalty α for beam search")
        sub.add_argument("--device", default=None, help="cuda, mps or cpu (default: the best present)")
        if name == "translate":
            sub.add_argument("sentences", nargs="*", help="source sentences (default: read stdin)")
        else:
            sub.add_argument("--split", default="test", help="split to score (multi30k: test_2016, test_2017)")
            sub.add_argument("--data-dir", default=None, help="local Multi30k folder")
            sub.add_argument("--limit", type=int, default=None, help="score only the first N sentences")
            sub.add_argument("--output", type=Path, default=None, help="write metrics and translations to this JSON")
    return parser


def _config_from_args(args, vocab_size: int, pad_id: int) -> TransformerConfig:
    return TransformerConfig(src_vocab_size=vocab_size, tgt_vocab_size=vocab_size, d_model=args.d_model,
                             n_heads=args.heads, d_ff=args.d_ff, n_encoder_layers=args.layers,
                             n_decoder_layers=args.layers, dropout=args.dropout, norm_first=not args.post_ln,
                             pad_id=pad_id)


def train_command(args) -> dict:
    """Train (or resume) a run; return its summary."""
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = pick_device(args.device)
    run = args.run
    run.mkdir(parents=True, exist_ok=True)
    langs = dict(src_lang=args.src_lang, tgt_lang=args.tgt_lang, data_dir=args.data_dir)
    train_pairs = load_pairs(args.data, "train", **langs)
    if (run / "tokenizer.json").is_file():
        tokenizer = SubwordTokenizer.load(run / "tokenizer.json")
    else:
        tokenizer = train_bpe_tokenizer([s for pair in train_pairs for s in pair], vocab_size=args.vocab_size)
        tokenizer.save(run / "tokenizer.json")
    config = _config_from_args(args, tokenizer.vocab_size, tokenizer.pad_id)
    (run / "config.json").write_text(json.dumps({"model": asdict(config), "data": args.data, **langs}, indent=2))
    model = build_transformer(config).to(device)
    data = TranslationData(train_pairs, tokenizer, args.max_tokens, max_len=config.max_len)
    optimizer, scheduler = make_optimizer(model, config.d_model, args.warmup, args.lr_factor)
    criterion = LabelSmoothingLoss(args.label_smoothing, ignore_index=tokenizer.pad_id)
    trainer = Trainer(model, lambda m, b: translation_loss(m, b, criterion), optimizer,
                      lambda epoch: data.batches(epoch, seed=args.seed), scheduler, device,
                      max_steps=args.max_steps, time_budget_s=args.time_budget, amp_dtype=args.amp,
                      progress=not args.no_progress)
    checkpoint_path = run / "checkpoint.pt"
    if checkpoint_path.is_file():
        trainer.restore(load_checkpoint(checkpoint_path, map_location=device))
        print(f"resuming {checkpoint_path} at step {trainer.state.step}", file=sys.stderr)
    trainer.add_callback("on_batch_end", checkpoint_callback(checkpoint_path, args.checkpoint_every))
    trainer.add_callback("on_train_end", lambda t: save_checkpoint(checkpoint_path, t.checkpoint()))
    state = trainer.fit()
    summary = {"steps": state.step, "epochs_started": state.epoch + 1, "train_seconds": round(state.elapsed, 1),
               "parameters": sum(p.numel() for p in model.parameters()), "history": state.history}
    (run / "history.json").write_text(json.dumps(summary, indent=1))
    return summary


def load_run(run: Path, device=None):
    """The trained model (in eval mode) and tokenizer of a run folder."""
    for name in ("config.json", "tokenizer.json", "checkpoint.pt"):
        if not (run / name).is_file():
            raise FileNotFoundError(f"{run / name} is missing; train first: python -m transformer_lib train --run {run}")
    device = pick_device(device)
    config = TransformerConfig(**json.loads((run / "config.json").read_text())["model"])
    model = build_transformer(config).to(device)
    model.load_state_dict(load_checkpoint(run / "checkpoint.pt", map_location=device)["model"])
    return model.eval(), SubwordTokenizer.load(run / "tokenizer.json")


def translate_command(args) -> list[str]:
    model, tokenizer = load_run(args.run, args.device)
    sentences = args.sentences or [line.strip() for line in sys.stdin if line.strip()]
    return translate(model, tokenizer, sentences, beam_size=args.beam, alpha=args.alpha)


def evaluate_command(args) -> dict:
    model, tokenizer = load_run(args.run, args.device)
    meta = json.loads((args.run / "config.json").read_text())
    pairs = load_pairs(meta["data"], args.split, meta.get("src_lang"), meta.get("tgt_lang"),
                       args.data_dir or meta.get("data_dir"), limit=args.limit)
    start = time.perf_counter()
    hypotheses = translate(model, tokenizer, [s for s, _ in pairs], beam_size=args.beam, alpha=args.alpha)
    metrics = score_translations(hypotheses, [t for _, t in pairs])
    metrics.update(split=args.split, sentences=len(pairs), beam=args.beam,
                   decode_seconds=round(time.perf_counter() - start, 1))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({"metrics": metrics, "translations": [
            {"source": s, "reference": t, "hypothesis": h} for (s, t), h in zip(pairs, hypotheses)]}, indent=1,
            ensure_ascii=False))
    return metrics


# The course's model of the built-in corpus: trained by notebook 11, used by notebooks 12 and 13.
COURSE_MODEL_ARGS = ["--data", "builtin", "--vocab-size", "1000", "--d-model", "128", "--heads", "4",
                     "--d-ff", "512", "--layers", "2", "--max-tokens", "2048", "--warmup", "200",
                     "--lr-factor", "0.7", "--max-steps", "300", "--seed", "0"]


def course_model(run: str | Path, device=None):
    """Load the course model from `run`, training it first (same settings every time) if absent.

    Equivalent to `python -m transformer_lib train --run RUN` with COURSE_MODEL_ARGS.
    """
    run = Path(run)
    if not (run / "checkpoint.pt").is_file() or not (run / "history.json").is_file():
        train_command(build_parser().parse_args(["train", "--run", str(run), "--no-progress", *COURSE_MODEL_ARGS]))
    return load_run(run, device)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "train":
            summary = train_command(args)
            print(json.dumps({k: v for k, v in summary.items() if k != "history"}))
        elif args.command == "translate":
            print("\n".join(translate_command(args)))
        else:
            print(json.dumps(evaluate_command(args)))
    except (ValueError, TypeError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
