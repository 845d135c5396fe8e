"""Command line for the course: `python -m transformer_lib {train,translate,evaluate} --help`.

Hand-written (no notebook is its home), and only a shell: `train` maps its options onto one
`TrainSettings` (each option but `--run` is a field of it, with the field's default and help) and calls
`train_run`; `translate` and `evaluate` load a run folder (`runs.RunFolder`) and call the
notebooks' decoding and scoring. Every problem the user can fix is one `error: ...` line and exit
code 2, with nothing written. Ctrl-C (or SIGTERM) during `train` saves a checkpoint and exits 130
(143) with the command that resumes it.

Data-parallel training: `torchrun --standalone --nproc_per_node=N -m transformer_lib -- train --run R ...`
(the `--` keeps torchrun from taking `--run` for an abbreviation of its own `--run-path`).
"""
import argparse
import dataclasses
import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path

from transformer_lib.run_config import RunError, one_line
from transformer_lib.options import (add_setting, alpha_choice, checked_number, device_name,  # noqa: F401
                                     nonnegative_float, parse_duration, path_argument)
from transformer_lib.settings import INT_LIMIT, TrainSettings

# torch and the course's other modules are imported inside the commands, after argparse has checked
# the arguments: a mistyped option is answered at once instead of after torch's seconds of import.


ATTENTION_MAX_TOKENS = 150    # the most tokens a side of `translate --attention` draws (30 px a token)
positive_int = checked_number({"kind": int, "ok": lambda v: 0 < v <= INT_LIMIT,
                               "wanted": f"a positive integer (at most {INT_LIMIT})"})


def attention_head(text: str) -> int | str:
    """A head number (from 1) or 'mean' (the mean of the heads)."""
    if text == "mean":
        return text
    return checked_number({"kind": int, "ok": lambda v: 0 < v <= INT_LIMIT,
                           "wanted": "a head number from 1, or mean"})(text)


def _launcher() -> list[str]:
    """How this command was started, for the resume line: torchrun with its processes a node, else python."""
    from transformer_lib.distributed import launched_by_torchrun   # torch: only once an interrupt needs it
    if launched_by_torchrun():
        nodes = int(os.environ.get("WORLD_SIZE", 1)) // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
        return ["torchrun", f"--nproc_per_node={os.environ.get('LOCAL_WORLD_SIZE', 1)}",
                *([f"--nnodes={nodes}"] if nodes > 1 else []), "-m", "transformer_lib", "--"]
    return ["python", "-m", "transformer_lib"]


def _is_main_process() -> bool:
    """False in the processes that torchrun starts besides rank 0: they keep quiet about errors."""
    return os.environ.get("RANK", "0") == "0"


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is answered with one line, not the whole usage text (by rank 0 only)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n" if _is_main_process() else None)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m transformer_lib", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train a model; resumes if the run folder has a checkpoint")
    train.add_argument("--run", type=path_argument, required=True, help="run folder (see transformer_lib/runs.py)")
    for f in dataclasses.fields(TrainSettings):
        add_setting(train, f)
    for name, text in (("translate", "translate sentences (arguments, or one per line on stdin)"),
                       ("evaluate", "score a trained model on a test split with sacreBLEU")):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("--run", type=path_argument, required=True, help="run folder written by `train`")
        sub.add_argument("--beam", type=positive_int, default=1, help="beam size, 1 = greedy (default: 1)")
        if name == "translate":
            sub.add_argument("--alpha", type=nonnegative_float, default=0.6,
                             help="length penalty α for beam search (default: 0.6, the paper's)")
        else:
            sub.add_argument("--alpha", type=alpha_choice, default=0.6, metavar="ALPHA|A,B,...|auto",
                             help="length penalty α for beam search (default: 0.6, the paper's); or candidates, "
                                  "separated by commas, from which the one whose beam search scores the highest "
                                  "BLEU on the run's validation split is chosen (--limit applies there too); auto: "
                                  "0.6, 0.8, ..., 2.0")
        sub.add_argument("--device", type=device_name, default=None,
                         help="cuda, mps or cpu (default: the best present)")
        sub.add_argument("--compile", action="store_true",
                         help="torch.compile encode and decode (pays on large test sets)")
        if name == "translate":
            sub.add_argument("sentences", nargs="*",
                             help="source sentences (default: stdin, one per line; a blank line gives a blank line)")
            sub.add_argument("--attention", type=path_argument, default=None, metavar="FILE.png|FOLDER",
                             help="also draw each translation's cross-attention (source tokens against output "
                                  "tokens): into FILE.png for one sentence, or into FOLDER as 001.png, 002.png, ... "
                                  "numbered by input sentence (default: none)")
            sub.add_argument("--attention-layer", type=positive_int, default=None, metavar="N",
                             help="decoder layer to draw, 1 = the first (default: the last)")
            sub.add_argument("--attention-head", type=attention_head, default="mean", metavar="N|mean",
                             help="head to draw, 1 = the first, or mean of the heads (default: mean)")
        else:
            sub.add_argument("--split", default="test", help="the run's split to score: train, valid, test (given or "
                             "carved as at training); multi30k also test_2016, test_2017 (default: test)")
            sub.add_argument("--data", default=None, help="score these pairs instead, written as train --data "
                             "(files:SRC,TGT, tsv:FILE, csv:FILE, hub:NAME[:CONFIG]) (default: the run's --split)")
            sub.add_argument("--data-dir", type=path_argument, default=None,
                             help="multi30k runs: local folder (default: the one the run was trained from)")
            sub.add_argument("--limit", type=positive_int, default=None, help="score only the first N sentences")
            sub.add_argument("--output", type=path_argument, default=None,
                             help="write metrics and translations to this JSON file")
    return parser


def settings_from(args) -> TrainSettings:
    """The TrainSettings the parsed `train` options say."""
    return TrainSettings(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainSettings)})


# --- translate and evaluate ------------------------------------------------------------------------

def _load_for_decoding(args):
    from transformer_lib.decoding import compile_for_decoding
    from transformer_lib.runs import RunFolder
    from transformer_lib.train_run import resolve_device
    device = resolve_device(args.device)
    folder = RunFolder(args.run).read(device)
    model = folder.load_model(device)
    return (compile_for_decoding(model) if args.compile else model), folder.tokenizer, folder.meta


def _check_source_lengths(tokenizer, sentences: list[str], labels: list[str], max_len: int,
                          why: str = "this model reads at most max_len={limit}; split it into shorter sentences") -> None:
    """RunError if a source has more tokens than the model's positional table holds (or than `why` allows)."""
    for label, ids in zip(labels, tokenizer.encode_batch(sentences, unknown="replace")):
        if len(ids) > max_len:
            raise RunError(f"{label} has {len(ids)} tokens (with <s> and </s>), but {why.format(limit=max_len)}")


def _within_max_len(tokenizer, pairs: list, max_len: int, split: str) -> tuple[list, int]:
    """The pairs whose source the model can read (at most max_len tokens with <s> and </s>, as training kept),
    and how many were left out, said on stderr with the first one's number."""
    lengths = [len(ids) for ids in tokenizer.encode_batch([s for s, _ in pairs], unknown="replace")]
    long = [i for i, n in enumerate(lengths) if n > max_len]
    if not long:
        return pairs, 0
    if len(long) == len(pairs):
        raise RunError(f"every sentence of {split} has more than the {max_len} tokens this model reads (max_len, with "
                       "<s> and </s>); score shorter sentences")
    print(f"note: {len(long)} of the {len(pairs)} sentences of {split} are longer than the {max_len} tokens this model "
          f"reads (max_len, with <s> and </s>; training dropped such pairs too), the first is sentence {long[0] + 1} "
          f"(counting from 1); the scores are of the other {len(pairs) - len(long)}", file=sys.stderr)
    return [pair for i, pair in enumerate(pairs) if lengths[i] <= max_len], len(long)


def _input_lines(args) -> tuple[list[str], list[str]]:
    """The sentences to translate, one per argument or per line of stdin (a blank one included), and
    a label for each (for messages). stdin is read as UTF-8 bytes; \\n, \\r\\n and \\r end a line."""
    if args.sentences:
        for i, text in enumerate(args.sentences, start=1):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:     # bytes that are not UTF-8 reach argv as lone surrogates
                raise RunError(f"sentence argument {i} is not valid UTF-8 text; pass UTF-8 (e.g. convert it with "
                               "iconv -t utf-8)") from None
        return list(args.sentences), [f"sentence argument {i}" for i in range(1, len(args.sentences) + 1)]
    if sys.stdin is None or not hasattr(sys.stdin, "buffer") or sys.stdin.closed:
        raise RunError("no sentences to translate: give them as arguments, or one per line on stdin (stdin is closed)")
    data = sys.stdin.buffer.read().replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    raw_lines = data.split(b"\n")
    if raw_lines[-1] == b"":
        raw_lines.pop()                 # the newline that ends the last line
    lines = []
    for number, raw in enumerate(raw_lines, start=1):
        try:
            lines.append(raw.decode("utf-8").removeprefix("\ufeff" if number == 1 else ""))
        except UnicodeDecodeError as error:
            raise RunError(f"line {number} of stdin is not UTF-8 ({error.reason} at byte {error.start + 1} of the "
                           "line); re-encode the input, e.g. with iconv -f latin1 -t utf-8") from None
    return lines, [f"line {i} of stdin" for i in range(1, len(lines) + 1)]


def _attention_paths(args, meta: dict, count: int, keep: list[int]) -> dict[int, Path]:
    """Where `--attention` draws the map of each input kept (by position), after checking the options
    against the model and the path: FILE.png for one sentence, else FOLDER/001.png, 002.png, ..."""
    from transformer_lib import runs
    layers, heads = meta["model"]["n_decoder_layers"], meta["model"]["n_heads"]
    if args.attention_layer is not None and args.attention_layer > layers:
        raise RunError(f"--attention-layer {args.attention_layer}: this model has {layers} decoder layers; "
                       f"give 1 to {layers} (default: the last)")
    if args.attention_head != "mean" and args.attention_head > heads:
        raise RunError(f"--attention-head {args.attention_head}: this model has {heads} heads; give 1 to {heads} "
                       "or mean (default: mean)")
    target = args.attention
    if target.suffix.lower() == ".png":
        if len(keep) != 1:
            raise RunError(f"--attention {target} is one image but {len(keep)} sentences were given; give a folder "
                           "(--attention maps) for one image a sentence")
        runs.check_output_file(target, "--attention")
        return {keep[0]: target}
    runs.check_writable(target, "--attention", folder=True)
    width = max(3, len(str(count)))
    return {i: target / f"{i + 1:0{width}d}.png" for i in keep}


def translate_command(args) -> list[str]:
    """One translation per input sentence, in order; a blank input gives a blank output. With
    `--attention`, each translation's cross-attention is drawn as well (transformer_lib.attention_map)."""
    from transformer_lib.evaluation import translate
    if args.attention is None and (args.attention_layer is not None or args.attention_head != "mean"):
        raise RunError("--attention-layer and --attention-head choose what --attention draws; add --attention "
                       "FILE.png (or FOLDER)")
    if args.attention is not None and args.compile:
        raise RunError("--attention reads the weights of an uncompiled pass; drop --compile")
    model, tokenizer, meta = _load_for_decoding(args)
    lines, labels = _input_lines(args)
    keep = [i for i, line in enumerate(lines) if line.strip()]
    _check_source_lengths(tokenizer, [lines[i] for i in keep], [labels[i] for i in keep], meta["model"]["max_len"])
    outputs = [""] * len(lines)
    if args.attention is not None:
        from transformer_lib.attention_map import draw_attention_map, translate_with_attention
        _check_source_lengths(tokenizer, [lines[i] for i in keep], [labels[i] for i in keep], ATTENTION_MAX_TOKENS,
                              "an attention map draws at most {limit} (one cell a token: a larger PNG is more than most "
                              "viewers open); translate it without --attention, or split it")
        paths = _attention_paths(args, meta, len(lines), keep)
        for i, path in paths.items():
            path.parent.mkdir(parents=True, exist_ok=True)         # the folder of --attention FOLDER
            result = translate_with_attention(model, tokenizer, lines[i], beam_size=args.beam, alpha=args.alpha,
                                              layer=args.attention_layer, head=args.attention_head)
            if len(result.out_tokens) > ATTENTION_MAX_TOKENS:
                raise RunError(f"the translation of {labels[i]} has {len(result.out_tokens)} tokens, but an attention "
                               f"map draws at most {ATTENTION_MAX_TOKENS}; translate it without --attention, or split "
                               "it into shorter sentences")
            draw_attention_map(result, path)
            outputs[i] = result.translation
        return outputs
    for i, translation in zip(keep, translate(model, tokenizer, [lines[i] for i in keep], beam_size=args.beam,
                                              alpha=args.alpha)):
        outputs[i] = translation
    return outputs


def _alpha(args, model, tokenizer, meta) -> tuple[float, dict | None]:
    """The α to decode with: `--alpha` itself, or, given candidates, the one `choose_alpha` takes on the run's
    validation split (the first `--limit` pairs of it), each candidate's score said on stderr."""
    from transformer_lib.evaluation import ALPHA_CANDIDATES, choose_alpha
    from transformer_lib.run_config import evaluation_pairs
    if isinstance(args.alpha, float):
        return args.alpha, None
    candidates = ALPHA_CANDIDATES if args.alpha == "auto" else args.alpha
    if args.beam == 1:                  # greedy decoding has no length penalty to choose
        return candidates[0], None
    valid = evaluation_pairs(args.run, meta, "valid", args.data_dir, None)[:args.limit]
    if not valid:
        raise RunError("the run has no validation pairs to choose alpha on; give --alpha a number")
    valid, _ = _within_max_len(tokenizer, valid, meta["model"]["max_len"], "valid")
    chosen = choose_alpha(model, tokenizer, valid, args.beam, candidates,
                          report=lambda line: print(f"choosing alpha on valid: {line}", file=sys.stderr))
    print(f"choosing alpha on valid: alpha {chosen['alpha']:g} scored highest", file=sys.stderr)
    return chosen["alpha"], chosen


def evaluate_command(args) -> dict:
    """Score the run on its own `--split` (its recorded data source's, carved again by its recorded
    seed), or on the pairs of `--data`."""
    from transformer_lib import runs
    from transformer_lib.evaluation import score_translations, translate
    from transformer_lib.run_config import evaluation_pairs
    if args.output is not None:      # refused now, not after the whole decode
        runs.check_output_file(args.output, "--output")
    model, tokenizer, meta = _load_for_decoding(args)
    pairs = evaluation_pairs(args.run, meta, args.split, args.data_dir, args.data)[:args.limit]
    args.split = args.split if args.data is None else args.data
    pairs, skipped = _within_max_len(tokenizer, pairs, meta["model"]["max_len"], args.split)
    alpha, chosen = _alpha(args, model, tokenizer, meta)
    start = time.perf_counter()
    hypotheses = translate(model, tokenizer, [s for s, _ in pairs], beam_size=args.beam, alpha=alpha)
    metrics = score_translations(hypotheses, [t for _, t in pairs])
    metrics.update(split=args.split, sentences=len(pairs), beam=args.beam, **({"alpha": alpha} if args.beam > 1 else {}),
                   **({"alpha_valid_bleu": chosen["valid_bleu"]} if chosen else {}),
                   decode_seconds=round(time.perf_counter() - start, 1), **({"skipped": skipped} if skipped else {}))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        runs.write_json(args.output, {"metrics": metrics, "translations": [
            {"source": s, "reference": t, "hypothesis": h} for (s, t), h in zip(pairs, hypotheses)]})
    return metrics


# --- main ------------------------------------------------------------------------------------------

def _is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError" or (
        isinstance(error, RuntimeError) and ("can't allocate memory" in str(error) or "out of memory" in str(error)))


def _write_stdout(text: str) -> None:
    """Write `text` as UTF-8 whatever the locale says (translations hold non-ASCII letters)."""
    sys.stdout.flush()
    if hasattr(sys.stdout, "buffer"):
        sys.stdout.buffer.write(text.encode("utf-8"))
        sys.stdout.buffer.flush()
    else:               # a notebook's stdout has no byte layer
        sys.stdout.write(text)


def _with_run(argv: list[str], run: Path) -> list[str]:
    """`argv` with its --run folder replaced by `run` (where a folder moved while training now is)."""
    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg == "--run" and i + 1 < len(argv) and Path(argv[i + 1]) != Path(run):
            argv[i + 1] = str(run)
        elif arg.startswith("--run=") and Path(arg[6:]) != Path(run):
            argv[i] = f"--run={run}"
    return argv


def main(argv: list[str] | None = None) -> int:
    """Run one command; a problem the user can fix is one `error: ...` line on stderr and exit code 2.
    Under torchrun, rank 0 prints it (and the summary); the other ranks exit quietly with code 2."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--"]:     # `torchrun -m transformer_lib -- train --run R` (torchrun would read --run as its own)
        argv = argv[1:]
    args = build_parser().parse_args(argv)   # exits with code 2 and a usage line on a bad argument
    own_errors = {}
    try:
        if args.command == "train":
            from transformer_lib.train_run import OWN_ERRORS, train_run
            own_errors = OWN_ERRORS
            summary = train_run(args.run, settings_from(args))
            output = (json.dumps({k: v for k, v in summary.items() if k != "history"}) + "\n"
                      if _is_main_process() else None)
        elif args.command == "translate":
            output = "".join(line + "\n" for line in translate_command(args))
        else:
            output = json.dumps(evaluate_command(args)) + "\n"
        if output is not None:
            _write_stdout(output)
    except KeyboardInterrupt as stop:
        if _is_main_process():
            run = getattr(stop, "run", None) or args.run        # where the folder is now, if it was moved
            again = shlex.join([*_launcher(), *_with_run(argv, run)])
            print(stop.message(run, again) if hasattr(stop, "message") else "interrupted; nothing was written",
                  file=sys.stderr)
        return 128 + getattr(stop, "signum", signal.SIGINT)
    except (RunError, ValueError, TypeError, OSError, FloatingPointError, RuntimeError, MemoryError) as error:
        if isinstance(error, RuntimeError) and not _is_out_of_memory(error):
            raise
        message = (f"out of memory ({one_line(error)[:120]}); lower --max-tokens or --beam, or train a smaller model"
                   if _is_out_of_memory(error) else one_line(error))
        if _is_main_process():
            print(f"error: {message}", file=sys.stderr)
        elif own_errors.get("speak"):
            print(f"error: (rank {os.environ['RANK']}) {message}", file=sys.stderr)
        return 2
    finally:
        if "transformer_lib.distributed" in sys.modules:    # leave torchrun's process group, if joined
            sys.modules["transformer_lib.distributed"].teardown_distributed()
    return 0
