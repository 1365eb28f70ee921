"""CLMR/LIWE text encoders and the non-local region image encoder: shapes, padding invariance, what each
pooling means, the identity non-local block at initialisation, gradient flow and the paper's counts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from prep.dataset import Vocabulary
from train.models import create_text_encoder
from train.models.language_agnostic import (
    ClmrEncoder,
    LiweEncoder,
    LiweWordEmbedder,
    clmr_word_table_parameters,
    liwe_word_embedder_parameters,
)
from train.models.liwe import format_word_embedding_report, word_embedding_report, word_length_from_statistics
from train.models.regions import NonLocalBlock, NonLocalRegionEncoder, create_region_encoder

# --- counts ------------------------------------------------------------------------------------------


def test_liwe_128_256_has_the_papers_115064_parameters():
    assert liwe_word_embedder_parameters(101, 26, (128, 256)) == 115_064
    encoder = LiweEncoder(101, d=32)
    assert sum(p.numel() for p in encoder.word_embedder.parameters()) == 115_064


@pytest.mark.parametrize(("n_a", "c_w", "f1", "f2"), [(101, 26, 256, 256), (72, 20, 64, 300), (30, 8, 16, 8)])
def test_embedder_count_is_the_papers_formula(n_a, c_w, f1, f2):
    # (N_a x d_c) + (d_c x C_w x f1) + (f1 x f2), section 2.2
    assert liwe_word_embedder_parameters(n_a, c_w, (f1, f2)) == n_a * 24 + 24 * c_w * f1 + f1 * f2


def test_word_embedding_report_shows_the_50x_claim():
    report = word_embedding_report(101, 26, (128, 256), 20_000)
    assert (report["liwe"], report["clmr"]) == (115_064, 6_000_000)
    assert report["ratio"] == pytest.approx(52.14, abs=0.01)
    text = format_word_embedding_report(report)
    assert "LIWE(128,256) word embedder: 115,064 parameters" in text
    assert "20,000 words x 300 = 6,000,000 parameters (52.1x" in text
    # the CLMR count is the size of the encoder's own table
    assert clmr_word_table_parameters(57) == ClmrEncoder(57, d=8).embedding.weight.numel()


def test_three_layer_variant_has_lavse_layer_sizes():
    embedder = LiweWordEmbedder(101, 26, (128, 256, 300))
    assert [tuple(layer.weight.shape) for layer in embedder.layers] == [(128, 624), (256, 128), (300, 256)]
    assert embedder.output_dim == 300 and all(layer.bias is None for layer in embedder.layers)


# --- text encoders ------------------------------------------------------------------------------------


def _clmr(pooling: str = "final", seed: int = 0) -> ClmrEncoder:
    torch.manual_seed(seed)
    return ClmrEncoder(50, d=16, word_dim=12, pooling=pooling).eval()


def _liwe(pooling: str = "final", seed: int = 0) -> LiweEncoder:
    torch.manual_seed(seed)
    return LiweEncoder(30, d=16, word_length=8, layers=(20, 12), pooling=pooling).eval()


def test_registered_shapes_and_inputs():
    clmr = create_text_encoder("clmr", 50, d=16)
    liwe = create_text_encoder("liwe", 30, d=16, word_length=8)
    assert (clmr.text_input, liwe.text_input) == ("words", "word_chars")
    assert clmr.output_dim == liwe.output_dim == 16
    lengths = torch.tensor([5, 2, 1])
    assert clmr(torch.randint(1, 50, (3, 5)), lengths).shape == (3, 16)
    assert liwe(torch.randint(1, 30, (3, 5, 8)), lengths).shape == (3, 16)
    # the BiGRU has d units per direction: the joint space itself (no text projection needed)
    assert clmr.gru.hidden_size == 16 and clmr.gru.bidirectional and clmr.embedding.embedding_dim == 300
    assert liwe.gru.input_size == 256


@pytest.mark.parametrize("pooling", ["last", "final", "mean"])
def test_clmr_padding_never_changes_a_caption(pooling):
    enc = _clmr(pooling)
    caption = torch.tensor([[4, 9, 2, 7]])
    alone = enc(caption, torch.tensor([4]))
    # batched with a longer caption, padded with non-zero garbage that must never be read
    batch = torch.tensor([[4, 9, 2, 7, 33, 41, 17], [5, 6, 7, 8, 9, 10, 11]])
    together = enc(batch, torch.tensor([4, 7]))
    torch.testing.assert_close(together[0:1], alone, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("pooling", ["last", "final", "mean"])
def test_liwe_padding_words_and_characters_never_change_a_caption(pooling):
    enc = _liwe(pooling)
    words = torch.tensor([[[3, 4, 5, 0, 0], [6, 7, 0, 0, 0], [8, 0, 0, 0, 0]]])  # C = 5 < C_w = 8
    alone = enc(words, torch.tensor([3]))
    padded = torch.zeros(2, 6, 8, dtype=torch.long)
    padded[0, :3, :5] = words[0]
    padded[0, 3:] = torch.randint(1, 30, (3, 8))  # garbage words beyond the length
    padded[1] = torch.randint(1, 30, (6, 8))
    together = enc(padded, torch.tensor([3, 6]))
    torch.testing.assert_close(together[0:1], alone, rtol=1e-5, atol=1e-6)
    # a padding word (all <pad>) is the zero vector
    assert enc.word_embedder(torch.zeros(8, dtype=torch.long)).abs().sum() == 0


def test_pooling_meanings():
    """``final``: each direction's final state averaged; ``last``: directions averaged at the last word;
    ``mean``: averaged outputs, mean over the words (all checked against an unpacked GRU run)."""
    caption = torch.tensor([[4, 9, 2, 7]])
    results = {}
    for pooling in ("final", "last", "mean"):
        enc = _clmr(pooling)
        with torch.no_grad():
            out, _ = enc.gru(enc.embedding(caption))  # (1, 4, 2d), no padding: no packing needed
            fwd, bwd = out[0, :, :16], out[0, :, 16:]
            expected = {"last": (fwd[-1] + bwd[-1]) / 2, "final": (fwd[-1] + bwd[0]) / 2,
                        "mean": ((fwd + bwd) / 2).mean(0)}[pooling]
            results[pooling] = enc(caption, torch.tensor([4]))[0]
        torch.testing.assert_close(results[pooling], expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(results["last"], results["final"])


def test_text_gradients_reach_every_parameter():
    lengths = torch.tensor([5, 3, 2])
    for enc, tokens in ((_clmr(), torch.randint(1, 50, (3, 5))), (_liwe(), torch.randint(1, 30, (3, 5, 8)))):
        enc.train()
        enc(tokens, lengths).pow(2).sum().backward()
        for name, p in enc.named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    # why "final" is the default: with "last" the backward direction has read one word from a zero state
    last = _clmr("last")
    last(torch.randint(1, 50, (3, 5)), lengths).pow(2).sum().backward()
    assert last.gru.weight_hh_l0_reverse.grad.abs().sum() == 0
    liwe = _liwe()
    liwe(torch.randint(0, 30, (2, 4, 8)), torch.tensor([4, 2])).sum().backward()
    assert liwe.word_embedder.chars.weight.grad[0].abs().sum() == 0  # <pad> stays the zero vector


def test_text_encoder_bad_input():
    with pytest.raises(ValueError, match="unknown pooling"):
        ClmrEncoder(10, pooling="max")
    with pytest.raises(ValueError, match="C_w = 8"):
        _liwe()(torch.ones(1, 2, 9, dtype=torch.long), torch.tensor([2]))
    with pytest.raises(ValueError, match=r"\(batch, words, characters\)"):
        _liwe()(torch.ones(1, 2, dtype=torch.long), torch.tensor([2]))


def test_word_length_from_statistics():
    counts = {"<pad>": 0, "<unk>": 0, **{"a" * n: 1 for n in range(1, 11)}}  # 10 words of lengths 1..10
    assert word_length_from_statistics(counts, coverage=1.0) == 10
    assert word_length_from_statistics(counts, coverage=0.9) == 9
    assert word_length_from_statistics(counts, coverage=0.55) == 6
    # word types, not occurrences: a frequent short word does not hide the long ones
    assert word_length_from_statistics({**counts, "a": 10**6}, coverage=0.9) == 9
    with pytest.raises(ValueError, match="coverage"):
        word_length_from_statistics(counts, coverage=0)


def test_words_are_spelled_by_the_one_text_codec():
    from train.engine.codecs import TextCodec

    chars = Vocabulary(["<pad>", "<unk>", "a", "b", "c"])
    spelled = TextCodec("word_chars", chars, 10, 4, "en").encode("", ["cab", "abcabc", "x"])
    assert spelled.tolist() == [[4, 2, 3, 0], [2, 3, 4, 2], [1, 0, 0, 0]]
    assert spelled.dtype.name == "int64"


# --- region image encoder ----------------------------------------------------------------------------


def _regions(b: int = 3, k: int = 6, dim: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, k, dim, generator=torch.Generator().manual_seed(seed))


def test_nonlocal_block_is_the_identity_at_initialisation():
    block = NonLocalBlock(32)
    assert block.gamma.item() == 0.0
    assert tuple(block.query.weight.shape) == (4, 32, 1) and tuple(block.value.weight.shape) == (32, 32, 1)
    x = torch.randn(2, 32, 6)
    torch.testing.assert_close(block(x), x, rtol=0, atol=0)
    enc = NonLocalRegionEncoder((6, 32), 16)
    plain = NonLocalRegionEncoder((6, 32), 16, nonlocal_block=False)
    plain.projection.load_state_dict(enc.projection.state_dict())
    torch.testing.assert_close(enc(_regions()), plain(_regions()), rtol=0, atol=0)


def test_region_encoder_is_the_mean_of_unit_region_embeddings():
    enc = NonLocalRegionEncoder((6, 32), 16, nonlocal_block=False)
    x = _regions()
    with torch.no_grad():
        z = F.leaky_relu(x @ enc.projection.weight[:, :, 0].T + enc.projection.bias, 0.1)
        expected = F.normalize(z, dim=2).mean(1)
        regions, mask = enc.region_embeddings(x)
        out = enc(x)
    assert out.shape == (3, 16) and enc.output_dim == 16 and mask.all()
    torch.testing.assert_close(regions.norm(dim=2), torch.ones(3, 6))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    assert (out.norm(dim=1) < 1).all()  # the final L2 normalisation is the joint model's


def test_padding_regions_never_change_an_image():
    torch.manual_seed(0)
    enc = NonLocalRegionEncoder((8, 32), 16)
    with torch.no_grad():
        enc.nonlocal_block.gamma.fill_(0.7)  # an active block: attention would reach the padding
    real = _regions(1, 5)
    alone = enc(real)
    padded = torch.cat([real, 100 * torch.randn(1, 3, 32)], dim=1)
    both = torch.cat([padded, _regions(1, 8, seed=1)])
    together = enc(both, counts=torch.tensor([5, 8]))
    torch.testing.assert_close(together[0:1], alone, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(enc(both[1:], counts=torch.tensor([8])), enc(both[1:]), rtol=0, atol=0)
    attention = enc.nonlocal_block.attention(padded.transpose(1, 2), torch.arange(8).unsqueeze(0) < 5)
    assert attention[0, :, 5:].abs().sum() == 0
    torch.testing.assert_close(attention.sum(-1), torch.ones(1, 8))


def test_region_gradients_flow_and_gamma_moves_first():
    enc = NonLocalRegionEncoder((6, 32), 16)
    enc(_regions()).pow(2).sum().backward()
    block = enc.nonlocal_block
    assert block.gamma.grad.abs().item() > 0  # gamma = 0 gets a gradient, so the block can switch on
    assert block.query.weight.grad.abs().sum() == 0  # behind gamma = 0
    with torch.no_grad():
        block.gamma.fill_(0.5)
    enc.zero_grad()
    enc(_regions(), counts=torch.tensor([6, 4, 2])).pow(2).sum().backward()
    for name, p in enc.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_region_encoder_construction():
    enc = create_region_encoder((36, 2048), 1024)
    assert enc.feature_shape == (36, 2048) and enc.nonlocal_block.query.out_channels == 256
    assert enc.num_parameters() == 2 * (2048 * 256 + 256) + 2048 * 2048 + 2048 + 1 + 2048 * 1024 + 1024
    assert NonLocalRegionEncoder((36, 64), 8, reduction=1).nonlocal_block.query.out_channels == 64
    with pytest.raises(ValueError, match=r"shape \(k, D\)"):
        NonLocalRegionEncoder((2048,), 1024)
