"""SEAM text encoders: table 2's counts, shapes, padding, the attention penalty, gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from train.models import create_text_encoder, list_text_encoders
from train.models.self_attention import SelfAttention, attention_penalty, seam_text_parameters

#: SEAM table 2: text-side parameters with a vocabulary of 11,360 words and a 1024-d joint space
TABLE_2 = {
    ("E", 10): 6_574_024, ("E", 15): 8_111_524, ("E", 20): 9_649_024, ("E", 30): 12_724_024,
    ("C", 5): 6_273_724, ("C", 7): 7_299_524, ("C", 10): 8_838_224, ("C", 15): 11_402_724,
    ("C", 20): 13_967_224,
}
VARIANTS = ("seam_e", "seam_c", "seam_g")
VOCAB = 50
SMALL = {"word_dim": 12, "attention_units": 10}


def _small(name: str, hops: int = 3, penalty: float = 0.0) -> nn.Module:
    extra = {"gru_units": 8} if name == "seam_g" else {}
    return create_text_encoder(name, VOCAB, hops=hops, penalty=penalty, **SMALL, **extra)


def _captions(lengths: list[int], steps: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random words (2 .. VOCAB-1) padded with 0 up to ``steps``."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.zeros(len(lengths), steps, dtype=torch.long)
    for row, n in enumerate(lengths):
        tokens[row, :n] = torch.randint(2, VOCAB, (n,), generator=gen)
    return tokens, torch.tensor(lengths)


def test_seam_encoders_are_registered_word_encoders():
    assert set(VARIANTS) <= set(list_text_encoders())
    for name in VARIANTS:
        assert _small(name).text_input == "words"


@pytest.mark.parametrize(("variant", "hops"), sorted(TABLE_2))
def test_text_side_counts_match_table_2_exactly(variant, hops):
    assert seam_text_parameters(variant, hops, 11_360) == TABLE_2[(variant, hops)]


def test_text_side_count_is_encoder_plus_a_biased_projection():
    """The projection term is what a real ``nn.Linear(output_dim, 1024)`` with bias holds."""
    encoder = create_text_encoder("seam_e", 11_360, hops=10)
    projection = nn.Linear(encoder.output_dim, 1024, bias=True)
    total = encoder.num_parameters() + sum(p.numel() for p in projection.parameters())
    assert total == seam_text_parameters("E", 10, 11_360) == 6_574_024


@pytest.mark.parametrize(("name", "width"), [("seam_e", 12), ("seam_c", 12 + 2 * 100), ("seam_g", 8)])
def test_output_shapes(name, width):
    encoder = _small(name, hops=4)
    tokens, lengths = _captions([5, 2, 7], 9)
    out = encoder(tokens, lengths)
    assert encoder.output_dim == width * 4
    assert out.shape == (3, width * 4) and out.dtype == torch.float32


@pytest.mark.parametrize("name", VARIANTS)
def test_padding_and_batch_never_change_a_caption(name):
    """The same caption padded to other lengths, with junk after its length, or next to other
    captions gets the same embedding and the same penalty."""
    torch.manual_seed(0)
    encoder = _small(name, penalty=1.0).eval()
    tokens, lengths = _captions([6], 6)
    alone = encoder(tokens, lengths)
    penalty_alone = encoder.penalty
    padded = torch.cat([tokens, torch.zeros(1, 9, dtype=torch.long)], dim=1)
    junk = padded.clone()
    junk[0, 6:] = torch.randint(2, VOCAB, (9,))
    others, other_lengths = _captions([15, 3], 15, seed=1)
    batch = torch.cat([padded, others])
    for t, n in ((padded, lengths), (junk, lengths), (batch, torch.cat([lengths, other_lengths]))):
        out = encoder(t, n)
        torch.testing.assert_close(out[:1], alone, rtol=1e-5, atol=1e-6)
    encoder(padded, lengths)
    torch.testing.assert_close(encoder.penalty, penalty_alone)


def test_attention_is_a_distribution_over_the_real_words_only():
    attention = SelfAttention(features=6, hops=4, units=5)
    h = torch.randn(2, 7, 6)
    mask = torch.tensor([[True] * 3 + [False] * 4, [True] * 7])
    m, a = attention(h, mask)
    assert a.shape == (2, 4, 7) and m.shape == (2, 4 * 6)
    assert torch.all(a[0, :, 3:] == 0)
    torch.testing.assert_close(a.sum(dim=2), torch.ones(2, 4))
    # M = H^T A, flattened hop-major
    torch.testing.assert_close(m[1].view(4, 6), a[1] @ h[1])


def test_penalty_is_zero_for_orthonormal_hops_and_positive_otherwise():
    orthogonal = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]])  # each hop on its own word
    assert attention_penalty(orthogonal).item() == 0.0
    redundant = torch.tensor([[[0.5, 0.5, 0.0], [0.5, 0.5, 0.0]]])  # both hops on the same words
    # A A^T = [[.5, .5], [.5, .5]] -> (A A^T - I) has entries -.5, .5, .5, -.5
    assert attention_penalty(redundant).item() == pytest.approx(1.0)


def test_penalty_is_lambda_times_the_sum_over_the_batch():
    tokens, lengths = _captions([4, 6], 6)
    penalties = {}
    for coefficient in (1.0, 0.25):
        torch.manual_seed(0)
        encoder = _small("seam_e", penalty=coefficient)
        encoder(tokens, lengths)
        penalties[coefficient] = encoder.penalty
        assert encoder.penalty.ndim == 0 and encoder.penalty.item() > 0
    torch.testing.assert_close(penalties[0.25], 0.25 * penalties[1.0])
    per_caption = []
    for row in range(2):
        encoder(tokens[row:row + 1], lengths[row:row + 1])
        per_caption.append(encoder.penalty)
    torch.testing.assert_close(per_caption[0] + per_caption[1], penalties[0.25])


def test_seam_c_penalty_sums_its_three_attention_modules():
    torch.manual_seed(0)
    encoder = _small("seam_c", penalty=0.5)
    tokens, lengths = _captions([5, 3], 5)
    encoder(tokens, lengths)
    annotations = []
    for module in (*encoder.conv_attention, encoder.word_attention):
        # the A of each module, captured on its way out
        module.register_forward_hook(lambda _m, _i, out: annotations.append(out[1]))
    encoder(tokens, lengths)
    assert len(annotations) == 3
    expected = 0.5 * sum(attention_penalty(a).sum() for a in annotations)
    torch.testing.assert_close(encoder.penalty, expected)


def test_no_penalty_without_a_coefficient():
    encoder = _small("seam_e", penalty=0.0)
    encoder(*_captions([3], 3))
    assert encoder.penalty is None


@pytest.mark.parametrize("name", VARIANTS)
def test_gradient_reaches_every_parameter(name):
    torch.manual_seed(0)
    encoder = _small(name, penalty=0.5)
    tokens, lengths = _captions([5, 3, 7], 7)
    (encoder(tokens, lengths).pow(2).sum() + encoder.penalty).backward()
    for pname, p in encoder.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, pname
    assert torch.all(encoder.embedding.weight.grad[0] == 0)  # <pad> is never trained


def test_penalty_alone_has_a_gradient_on_the_attention():
    torch.manual_seed(0)
    encoder = _small("seam_e", penalty=1.0)
    encoder(*_captions([5, 4], 5))
    encoder.penalty.backward()
    assert encoder.attention.w2.weight.grad.abs().sum() > 0
    assert encoder.attention.w1.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("name", VARIANTS)
def test_deterministic_given_a_seed(name):
    tokens, lengths = _captions([5, 3], 6)
    outs = []
    for _ in range(2):
        torch.manual_seed(7)
        outs.append(_small(name)(tokens, lengths))
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("name", VARIANTS)
def test_empty_caption_is_finite(name):
    out = _small(name, penalty=1.0)(torch.zeros(2, 4, dtype=torch.long), torch.tensor([0, 0]))
    assert torch.isfinite(out).all()


def test_bad_hops_or_penalty_are_refused():
    with pytest.raises(ValueError, match="hops"):
        create_text_encoder("seam_e", VOCAB, hops=0)
    with pytest.raises(ValueError, match="penalty"):
        create_text_encoder("seam_c", VOCAB, penalty=-0.1)


def test_seam_c_convolutions_keep_the_length_and_width_2_looks_back():
    torch.manual_seed(0)
    encoder = _small("seam_c")
    maps = []
    for conv in encoder.convs:
        conv.register_forward_hook(lambda _m, _i, out: maps.append(out))
    tokens, lengths = _captions([5], 5)
    encoder(tokens, lengths)
    changed = tokens.clone()
    changed[0, 1] = 1 if tokens[0, 1] != 1 else 2
    encoder(changed, lengths)
    width2, width3, width2_changed, width3_changed = maps
    assert width2.shape == width3.shape == (1, 100, 5)
    # word 1 enters width 2 at positions 1, 2 and width 3 at positions 0, 1, 2
    assert torch.equal(width2[..., [0, 3, 4]], width2_changed[..., [0, 3, 4]])
    assert not torch.equal(width2[..., 2], width2_changed[..., 2])
    assert not torch.equal(width3[..., 0], width3_changed[..., 0])
    assert torch.equal(width3[..., 3:], width3_changed[..., 3:])
