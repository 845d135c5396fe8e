"""The peer of the Multi30k benchmark: PyTorch's own nn.Transformer, dressed with the same embedding,
positions, tying and interface (encode / decode / new_cache / generator) as our model, so that the
same trainer and the same decoders drive both.

Hand-written, used by scripts/benchmark_multi30k.py and checked by tests/test_peer_transformer.py.
nn.Transformer has no key/value cache. For decoding, `decode(..., cache=...)` instead keeps each
decoder layer's self-attention inputs of the positions already generated and runs the layer's own
submodules on the newest position only: the same tokens as recomputing everything, while each
step's cost no longer grows with the whole prefix pushed through every layer.
"""
import warnings

import torch
from torch import Tensor, nn

from transformer_lib.embeddings import TokenEmbedding
from transformer_lib.model import TransformerConfig
from transformer_lib.positional import PositionalEncoding


class PeerTransformer(nn.Module):
    """nn.Transformer(batch_first=True) with one shared, scaled embedding, sinusoidal positions and
    an output layer tied to the embedding: our model's sizes, tying and initialisation of the
    embedding, with PyTorch's layers in between."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.embed = TokenEmbedding(config.src_vocab_size, config.d_model, padding_idx=config.pad_id)
        self.positions = PositionalEncoding(config.d_model, config.max_len, config.dropout)
        with warnings.catch_warnings():   # "enable_nested_tensor is True, but ...": turned off just below
            warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
            self.core = nn.Transformer(config.d_model, config.n_heads, config.n_encoder_layers,
                                       config.n_decoder_layers, config.d_ff, config.dropout, batch_first=True,
                                       norm_first=config.norm_first)
        # The nested-tensor fast path (post-LN, eval) is a prototype that warns; padded tensors, like ours.
        self.core.encoder.enable_nested_tensor = self.core.encoder.use_nested_tensor = False
        self.generator = nn.Linear(config.d_model, config.tgt_vocab_size, bias=False)
        self.generator.weight = self.tgt_embed.embedding.weight

    # One shared embedding, also reachable under our model's names (the decoders' checks read them).
    @property
    def src_embed(self) -> TokenEmbedding:
        return self.embed

    @property
    def tgt_embed(self) -> TokenEmbedding:
        return self.embed

    def encode(self, src: Tensor, src_key_padding_mask: Tensor | None = None) -> Tensor:
        return self.core.encoder(self.positions(self.src_embed(src)), src_key_padding_mask=src_key_padding_mask)

    def new_cache(self) -> list[dict]:
        """One dict per decoder layer; `decode` keeps the layer's self-attention inputs in ["self"]["inputs"]."""
        return [{} for _ in self.core.decoder.layers]

    def decode(self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None,
               tgt_key_padding_mask: Tensor | None = None, memory_key_padding_mask: Tensor | None = None,
               cache: list[dict] | None = None) -> Tensor:
        """Target ids (B, T) -> decoder states (B, T, D). With `cache`, `tgt` is the newest position only."""
        if cache is None:
            return self.core.decoder(self.positions(self.tgt_embed(tgt)), memory, tgt_mask=tgt_mask,
                                     tgt_key_padding_mask=tgt_key_padding_mask,
                                     memory_key_padding_mask=memory_key_padding_mask)
        if self.training or tgt.size(1) != 1 or tgt_key_padding_mask is not None:
            raise ValueError("decode with a cache takes one new position at a time, without padding, in eval "
                             f"mode (got {tgt.size(1)} positions, training={self.training})")
        past = cache[0].get("self", {}).get("inputs")
        x = self.positions(self.tgt_embed(tgt), offset=0 if past is None else past.size(1))   # (B, 1, D)
        for layer, layer_cache in zip(self.core.decoder.layers, cache):
            x = self._layer_step(layer, x, layer_cache.setdefault("self", {}), memory, memory_key_padding_mask)
        return x if self.core.decoder.norm is None else self.core.decoder.norm(x)

    @staticmethod
    def _layer_step(layer: nn.TransformerDecoderLayer, x: Tensor, self_cache: dict, memory: Tensor,
                    memory_key_padding_mask: Tensor | None) -> Tensor:
        """nn.TransformerDecoderLayer's forward (eval mode: no dropout) for one new position, whose
        self-attention reads the cached inputs of the earlier positions. No causal mask is needed:
        the newest position may see all of them."""
        def self_attention(h: Tensor) -> Tensor:
            past = self_cache.get("inputs")
            self_cache["inputs"] = keys = h if past is None else torch.cat([past, h], dim=1)   # (B, t, D)
            return layer.self_attn(h, keys, keys, need_weights=False)[0]

        def cross_attention(h: Tensor) -> Tensor:
            return layer.multihead_attn(h, memory, memory, key_padding_mask=memory_key_padding_mask,
                                        need_weights=False)[0]

        def feed_forward(h: Tensor) -> Tensor:
            return layer.linear2(layer.activation(layer.linear1(h)))

        if layer.norm_first:
            x = x + self_attention(layer.norm1(x))
            x = x + cross_attention(layer.norm2(x))
            return x + feed_forward(layer.norm3(x))
        x = layer.norm1(x + self_attention(x))
        x = layer.norm2(x + cross_attention(x))
        return layer.norm3(x + feed_forward(x))

    def forward(self, src: Tensor, tgt: Tensor, src_key_padding_mask: Tensor | None = None,
                tgt_key_padding_mask: Tensor | None = None) -> Tensor:
        memory = self.encode(src, src_key_padding_mask)
        causal = torch.triu(torch.ones(tgt.size(1), tgt.size(1), dtype=torch.bool, device=tgt.device), 1)
        return self.generator(self.decode(tgt, memory, causal, tgt_key_padding_mask, src_key_padding_mask))
