"""The checks behind notebook 12's greedy-decoding exercise (hand-written, not exported).

The public `check_greedy_decode` lives in `transformer_lib.exercises.decoding`, one module per notebook; this
module holds what it compares with: the course's `greedy_decode` on tiny random Transformers, and hand-built
models (`_ReversingModel`) whose sentences end at different steps and whose answer changes with the source padding
and the causal mask, so that each usual slip gives other tokens, or more steps, and is named (`_greedy`, `_SLIPS`).
"""
import torch
from torch import nn

from transformer_lib.attention import subsequent_mask
from transformer_lib.decoding import beam_search, greedy_decode
from transformer_lib.exercises import Refuse, call, fresh_random
from transformer_lib.exercises.explain import is_int, what_it_is
from transformer_lib.exercises.guards import equal
from transformer_lib.model import Transformer

PAD, BOS, EOS = 0, 1, 2
_FROM_SCRATCH = "write greedy decoding from scratch, without the course's greedy_decode or beam_search"
_NO_DECODER = [Refuse(greedy_decode, _FROM_SCRATCH), Refuse(beam_search, _FROM_SCRATCH)]


class _Biased(nn.Module):
    """A model's output layer plus a fixed bias on the logits (to make </s> likely or unlikely)."""

    def __init__(self, generator: nn.Module, bias: torch.Tensor):
        super().__init__()
        self.generator, self.bias = generator, bias

    def forward(self, hidden):
        return self.generator(hidden) + self.bias


def _tiny_model(seed: int, eos_bias: float, vocab_size: int = 11) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(vocab_size, vocab_size, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=2,
                        n_decoder_layers=2, dropout=0.0, max_len=64, pad_id=PAD).eval()
    model.generator = _Biased(model.generator, torch.eye(vocab_size)[EOS] * eos_bias)
    return model


class _Vocabulary(nn.Module):
    def __init__(self, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size


class _ReversingModel(nn.Module):
    """A hand-built encoder-decoder with the Transformer's decoding API (`encode`, `decode` with or
    without a cache, `new_cache`, `generator`, `forward`) that writes each source sentence reversed,
    then </s>, then goes on babbling. It reads the sentence's length from the masks as attention would:
    the encoder counts the keys `src_key_padding_mask` leaves (the padded width without it), the decoder
    those `memory_key_padding_mask` leaves; a decoder pass whose `tgt_mask` lets a position see a later
    one writes only `_SEEN_THE_FUTURE`. So each of those slips changes the answer, and sentences of
    different lengths end at different steps. It records the longest prefix it was asked to extend."""

    _SEEN_THE_FUTURE = 3

    def __init__(self, vocab_size: int = 11, max_len: int = 64):
        super().__init__()
        self.vocab_size, self.max_len = vocab_size, max_len
        self.tgt_embed = _Vocabulary(vocab_size)
        self.generator = nn.Identity()                    # decode already returns logits
        self.longest_prefix = 0

    def encode(self, src: torch.Tensor, src_key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, S = src.shape
        if src_key_padding_mask is not None and src_key_padding_mask.shape != (B, S):
            raise ValueError(f"src_key_padding_mask must have the shape of src (B, S) = {(B, S)}, got "
                             f"{tuple(src_key_padding_mask.shape)}")
        n_keys = torch.full((B,), S) if src_key_padding_mask is None else (~src_key_padding_mask.bool()).sum(1)
        one_hot = nn.functional.one_hot(src, self.vocab_size).float()                    # (B, S, V)
        return torch.cat([one_hot, n_keys[:, None, None].float().expand(B, S, 1)], dim=-1)  # (B, S, V + 1)

    def new_cache(self) -> list[dict]:
        return [{}]

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, tgt_mask: torch.Tensor | None = None,
               tgt_key_padding_mask: torch.Tensor | None = None, memory_key_padding_mask: torch.Tensor | None = None,
               cache: list[dict] | None = None) -> torch.Tensor:
        B, T = tgt.shape
        S = memory.size(1)
        if memory.dim() != 3 or memory.size(0) != B or memory.size(-1) != self.vocab_size + 1:
            raise ValueError(f"memory must be what encode returned, (B, S, D) with B = {B}, got {tuple(memory.shape)}")
        if memory_key_padding_mask is not None and memory_key_padding_mask.shape != (B, S):
            raise ValueError(f"memory_key_padding_mask must be (B, S) = {(B, S)}, the source padding, got "
                             f"{tuple(memory_key_padding_mask.shape)}")
        if tgt_key_padding_mask is not None and tgt_key_padding_mask.shape != (B, T):
            raise ValueError(f"tgt_key_padding_mask must be (B, T) = {(B, T)}, got {tuple(tgt_key_padding_mask.shape)}")
        offset = 0
        if cache is not None:
            offset = cache[0].get("length", 0)
            cache[0]["length"] = offset + T
        self.longest_prefix = max(self.longest_prefix, offset + T)
        future_seen = False
        if T > 1:
            if tgt_mask is None:
                future_seen = True
            else:
                if tgt_mask.shape[-2:] != (T, T):
                    raise ValueError(f"tgt_mask must be (T, T) = {(T, T)} (or (B, T, T)), got {tuple(tgt_mask.shape)}")
                if tgt_mask.dtype != torch.bool:                    # as the course's Transformer
                    raise TypeError(f"tgt_mask must be a bool tensor with True = blocked (may not attend), got "
                                    f"dtype {tgt_mask.dtype}")
                future_seen = not equal(tgt_mask.expand(B, T, T), subsequent_mask(T).expand(B, T, T))
        n_enc = memory[:, 0, -1].long()                                             # (B,) keys the encoder saw
        n_dec = torch.full((B,), S) if memory_key_padding_mask is None else (~memory_key_padding_mask.bool()).sum(1)
        tokens = memory[..., :-1].argmax(-1)                                        # (B, S) source ids
        out = torch.empty(B, T, dtype=torch.long)
        for b in range(B):
            for t in range(T):
                p = offset + t                                       # position of this output (0 = after <s>)
                if future_seen:
                    out[b, t] = self._SEEN_THE_FUTURE
                elif p < n_dec[b] - 2:                               # the sentence without <s> and </s>, reversed
                    out[b, t] = tokens[b, max(int(n_enc[b]) - 2 - p, 0)]
                elif p == n_dec[b] - 2:
                    out[b, t] = EOS
                elif (p + b) % 4 == 0:                               # after </s>: babble, </s> again at times
                    out[b, t] = EOS
                else:
                    out[b, t] = 4 + (p + b) % (self.vocab_size - 4)
        return 10.0 * nn.functional.one_hot(out, self.vocab_size).float()            # (B, T, V) logits

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, src_key_padding_mask: torch.Tensor | None = None,
                tgt_key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        memory = self.encode(src, src_key_padding_mask)
        hidden = self.decode(tgt, memory, subsequent_mask(tgt.size(1)), tgt_key_padding_mask, src_key_padding_mask)
        return self.generator(hidden)


def _sources(lengths: list[int], seed: int, vocab_size: int = 11) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), PAD, dtype=torch.long)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.cat([torch.tensor([BOS]), torch.randint(3, vocab_size, (n - 2,), generator=g),
                                torch.tensor([EOS])])
    return src, src == PAD


@torch.no_grad()
def _greedy(model, src, mask, max_len, causal=True, encoder_mask=True, decoder_mask=True, invert_mask=False,
            stop="all", cut="first", keep_bos=False, position=-1) -> list[list[int]]:
    """Greedy decoding without a cache; the arguments other than the first four reproduce the usual slips."""
    if invert_mask:
        mask = ~mask
    memory = model.encode(src, mask if encoder_mask else None)
    ys = torch.full((src.size(0), 1), BOS, dtype=torch.long)
    for _ in range(max_len):
        hidden = model.decode(ys, memory, subsequent_mask(ys.size(1)) if causal else None, None,
                              mask if decoder_mask else None)
        ys = torch.cat([ys, model.generator(hidden[:, position]).argmax(-1, keepdim=True)], dim=1)
        ended = (ys == EOS).any(dim=1)
        if stop == "all" and ended.all() or stop == "any" and ended.any() or stop == "first row" and ended[0]:
            break
    rows = ys.tolist() if keep_bos else ys[:, 1:].tolist()
    if cut == "first":
        return [row[:row.index(EOS)] if EOS in row else row for row in rows]
    if cut == "last":
        return [row[:len(row) - 1 - row[::-1].index(EOS)] if EOS in row else row for row in rows]
    if cut == "drop ids":
        return [[i for i in row if i != EOS] for row in rows]
    return rows


# The usual slips, each as arguments of _greedy, with the message that names it.
_SLIPS = [
    ("drop the leading <s>: return only the generated ids", dict(keep_bos=True)),
    ("each output still holds its </s>; cut every sentence at its first </s> and leave the </s> out",
     dict(cut="keep")),
    ("your decoding never stops at </s>: it ran all max_len steps and returned what the model wrote after </s> too. "
     "A sentence ends at its first </s>: stop once every sentence has produced it, and cut each there",
     dict(stop="never", cut="keep")),
    ("you ran all max_len steps and removed the </s> ids, but kept what the model wrote AFTER </s>; a sentence "
     "ends at its first </s>: stop once every sentence has produced it, and cut each at its own",
     dict(stop="never", cut="drop ids")),
    ("you removed the </s> ids but kept what the model wrote AFTER </s>; a sentence ends at its first </s>: "
     "cut there, row[:row.index(eos_id)]", dict(cut="drop ids")),
    ("each sentence must be cut at its FIRST </s>; you cut at the last one, keeping what came after the first",
     dict(cut="last")),
    ("the loop stopped when sentence 0 ended; go on until EVERY sentence has produced </s> (or max_len), "
     "(ys == eos_id).any(dim=1).all()", dict(stop="first row")),
    ("the whole batch stopped when the FIRST sentence ended; each sentence ends at its own </s> (or max_len): "
     "go on until every sentence has produced </s>, then cut each at its own", dict(stop="any")),
    ("no causal mask: a full pass over the prefix needs tgt_mask=subsequent_mask(t), or position i sees "
     "positions after it", dict(causal=False)),
    ("the decoder does not get the source padding mask: pass src_key_padding_mask to model.decode as "
     "memory_key_padding_mask, or cross-attention reads the padding", dict(decoder_mask=False)),
    ("the encoder does not get the source padding mask: model.encode(src, src_key_padding_mask)",
     dict(encoder_mask=False)),
    ("the source padding is ignored in both encode and decode: pass src_key_padding_mask to model.encode and, "
     "as memory_key_padding_mask, to model.decode", dict(encoder_mask=False, decoder_mask=False)),
    ("the padding mask is inverted: True marks padding, pass src_key_padding_mask as it is",
     dict(invert_mask=True)),
    ("you took the prediction at the FIRST position; the next token is predicted at the last one, hidden[:, -1]",
     dict(position=0)),
]


def _decode_hint(error: Exception) -> str:
    return ("check the calls: model.encode(src, src_key_padding_mask), then model.decode(ys, memory, "
            "subsequent_mask(ys.size(1)), None, src_key_padding_mask) (the source padding is the "
            "memory_key_padding_mask, the 5th argument), and model.generator(hidden[:, -1]) for the (B, V) logits")


def _compare(your_function, model, src, mask, max_len: int, expected: list[list[int]], what: str) -> None:
    src_in, mask_in = src.clone(), mask.clone()
    with torch.no_grad():
        got = call(your_function, model, src_in, mask_in, BOS, EOS, max_len, on=f"decoding {what} "
                   f"(src {tuple(src.shape)}, max_len={max_len})", hint=_decode_hint, refuse=_NO_DECODER)
    assert equal(src_in, src) and equal(mask_in, mask), "your function changed src or the mask in place"
    if isinstance(got, (list, tuple)) and got and all(isinstance(i, int) for i in got) and len(expected) == 1:
        raise AssertionError(f"{what}: for a batch of ONE sentence you returned a flat list of ids {list(got)}; return "
                             "one list per sentence whatever the batch size, here [[...]] (a squeeze() or a [0] "
                             "too many?)")
    assert isinstance(got, (list, tuple)) and all(isinstance(row, (list, tuple)) or torch.is_tensor(row) for row in got), \
        f"return a list with one list of ids per sentence, got {type(got).__name__}"
    raw, got = got, [[int(i) for i in row] for row in got]
    assert len(got) == len(expected), f"return one list of ids per sentence: {len(expected)}, got {len(got)}"
    if got == expected:
        odd = next((row for row in raw if not isinstance(row, list) or not all(is_int(i) for i in row)), None)
        assert isinstance(raw, list) and odd is None, (
            f"{what}: the right ids, but return a list of lists of ints, as the statement asks; you returned "
            f"{what_it_is(raw) if not isinstance(raw, list) else 'a list holding ' + what_it_is(odd)}: "
            "row.tolist() turns a tensor of ids into a list of ints")
        return
    for message, slip in _SLIPS:
        wrong = _greedy(model, src, mask, max_len, **slip)
        if wrong != expected and got == wrong:
            raise AssertionError(f"{what}: {message}")
    for wrong_len, message in ((max_len + 1, "one token more than max_len"), (max_len - 1, "one token fewer than "
                               "max_len (the <s> does not count)")):
        if wrong_len > 0 and got == _greedy(model, src, mask, wrong_len) != expected:
            raise AssertionError(f"{what}: you generated {message}; max_len counts the generated tokens, </s> "
                                 "included, and a sentence stops after max_len of them")
    with torch.no_grad():
        again = call(your_function, model, src, mask, BOS, EOS, max_len, on=f"decoding {what} again", refuse=_NO_DECODER)
    if [[int(i) for i in row] for row in again] != got:
        raise AssertionError(f"{what}: two calls gave different outputs; greedy decoding takes the most likely token, "
                             "argmax(-1), at every step (no sampling)")
    for i, (g, e) in enumerate(zip(got, expected)):
        if g != e:
            trailing = [x for x in g[len(e):]] if g[:len(e)] == e else []
            if trailing and set(trailing) <= {PAD, EOS}:
                raise AssertionError(f"{what}, sentence {i}: {g} ends with padding or </s> ids; return each sentence "
                                     "without them (a list of lists of different lengths, not a padded tensor)")
            raise AssertionError(f"{what}, sentence {i}: expected {e}, got {g}. Encode once with the padding "
                                 "mask; at each step decode the prefix with subsequent_mask and the padding as "
                                 "memory_key_padding_mask, take the argmax at the last position, stop when every "
                                 "sentence has produced </s> (or after max_len tokens), and cut each at its </s>")


def greedy_checks(your_function) -> None:
    # Hand-built models: the reversed source, then </s>; sentences end at steps 6, 3, 8 and 4.
    src, mask = _sources([7, 4, 9, 5], seed=0)
    for max_len in (12, 5):
        model = _ReversingModel()
        expected = _greedy(model, src, mask, max_len)
        steps = _ReversingModel()
        _compare(your_function, steps, src, mask, max_len, expected, f"a hand-built model that writes each source "
                 f"sentence reversed")
        needed = max(len(e) + 1 for e in expected) if max_len == 12 else max_len
        if steps.longest_prefix > needed:
            raise AssertionError(f"every sentence had produced </s> after {needed} steps, but your decoder went on "
                                 f"to {steps.longest_prefix} (max_len={max_len}): stop as soon as every sentence has "
                                 "ended, instead of always running max_len steps and cutting afterwards")
    rng = fresh_random()
    for lengths, what in (([6], "a batch of one sentence (B = 1)"), ([], "a batch of no sentences (B = 0)")):
        src, mask = _sources(lengths, 5) if lengths else (torch.zeros(0, 4, dtype=torch.long),) * 2
        mask = mask.bool()
        _compare(your_function, _ReversingModel(), src, mask, 12, _greedy(_ReversingModel(), src, mask, 12),
                 f"{what} and a hand-built model that writes it reversed")
    lengths = [rng.randint(3, 12) for _ in range(rng.randint(2, 6))]
    src, mask = _sources(lengths, rng.randrange(10 ** 6))
    _compare(your_function, _ReversingModel(), src, mask, 15, _greedy(_ReversingModel(), src, mask, 15),
             f"a hand-built model that writes each of {len(lengths)} source sentences of lengths {lengths} reversed")
    # Tiny random Transformers. eos_bias: 0 leaves </s> rare (outputs run to max_len), 2.5 makes sentences end early.
    drawn = (rng.randrange(4, 10 ** 6), round(rng.uniform(1.0, 3.0), 2), rng.randint(4, 14))
    for seed, eos_bias, max_len in ((0, 0.0, 6), (1, 2.5, 12), (2, 2.5, 12), (3, 1.5, 9), drawn):
        model = _tiny_model(seed, eos_bias)
        src, mask = _sources([7, 4, 9, 5] if seed < 4 else lengths, seed)
        expected = greedy_decode(model, src, mask, BOS, EOS, max_len=max_len, use_cache=False)
        _compare(your_function, model, src, mask, max_len, expected, f"a tiny random Transformer (seed {seed})")
