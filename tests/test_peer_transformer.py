"""Tests for scripts/peer_transformer.py, the benchmark's nn.Transformer peer: its incremental
decoding (cached self-attention inputs) gives the same states and tokens as recomputing every
position, post-LN and pre-LN, with padded sources, in greedy decoding and in beam search; on the
CPU and, where present, on CUDA (the Multi30k benchmark's --device)."""
import sys
from pathlib import Path

import pytest
import torch

from tests.reference_weights import DEVICE, NORM_FIRST
from transformer_lib.attention import subsequent_mask
from transformer_lib.decoding import beam_search, greedy_decode
from transformer_lib.model import TransformerConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from peer_transformer import PeerTransformer  # noqa: E402

V, PAD, BOS, EOS = 13, 0, 1, 2


def tiny_peer(norm_first: bool, seed: int = 1, device: str = "cpu") -> PeerTransformer:
    torch.manual_seed(seed)
    config = TransformerConfig(V, V, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=2, n_decoder_layers=2,
                               dropout=0.1, max_len=64, norm_first=norm_first, pad_id=PAD)
    peer = PeerTransformer(config)
    # An untied random output layer: tied to the embedding, an untrained model mostly repeats its input token.
    peer.generator.weight = torch.nn.Parameter(torch.randn(V, 16))
    return peer.to(device).eval()


def padded_sources(lengths=(7, 4, 6), device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    src = torch.full((len(lengths), max(lengths)), PAD, dtype=torch.long)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(3, V, (n,), generator=g)
    return src.to(device), src.to(device) == PAD


@DEVICE
@NORM_FIRST
@torch.no_grad()
def test_cached_decode_equals_full_recomputation(norm_first, device):
    peer = tiny_peer(norm_first, device=device)
    src, src_pad = padded_sources(device=device)
    memory = peer.encode(src, src_pad)
    tgt = torch.randint(3, V, (src.size(0), 9), generator=torch.Generator().manual_seed(2)).to(device)
    full = peer.decode(tgt, memory, subsequent_mask(tgt.size(1), device), None, src_pad)    # (B, T, D)
    cache = peer.new_cache()
    steps = [peer.decode(tgt[:, t:t + 1], memory, None, None, src_pad, cache) for t in range(tgt.size(1))]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache[0]["self"]["inputs"].shape == (src.size(0), tgt.size(1), 16)


@DEVICE
@NORM_FIRST
@pytest.mark.parametrize("beam_size", [1, 4])
def test_cached_decoding_gives_the_same_tokens(norm_first, beam_size, device):
    peer = tiny_peer(norm_first, device=device)
    src, src_pad = padded_sources(device=device)
    kwargs = dict(bos_id=BOS, eos_id=EOS, max_len=12)
    search = greedy_decode if beam_size == 1 else lambda *a, **k: beam_search(*a, beam_size=beam_size, **k)
    cached = search(peer, src, src_pad, use_cache=True, **kwargs)
    recomputed = search(peer, src, src_pad, use_cache=False, **kwargs)
    assert cached == recomputed
    assert len({token for ids in cached for token in ids}) > 1     # not one token repeated


def test_cached_decode_refuses_training_mode_and_several_positions():
    peer = tiny_peer(norm_first=True)
    src, src_pad = padded_sources()
    memory = peer.encode(src, src_pad)
    with pytest.raises(ValueError, match="one new position at a time"):
        peer.decode(torch.full((3, 2), BOS), memory, None, None, src_pad, peer.new_cache())
    peer.train()
    with pytest.raises(ValueError, match="in eval mode"):
        peer.decode(torch.full((3, 1), BOS), memory, None, None, src_pad, peer.new_cache())
