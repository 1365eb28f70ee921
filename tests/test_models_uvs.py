"""UVS word-embedding + GRU encoder of the FNE paper's VSE pipelines."""

from __future__ import annotations

import pytest
import torch

from train.models import create_text_encoder, list_text_encoders

VOCAB = 40


def _encoder(d: int = 6, word_dim: int = 5):
    return create_text_encoder("uvs_gru", VOCAB, d=d, word_dim=word_dim)


def _captions(lengths: list[int], steps: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.zeros(len(lengths), steps, dtype=torch.long)
    for row, n in enumerate(lengths):
        tokens[row, :n] = torch.randint(2, VOCAB, (n,), generator=gen)
    return tokens, torch.tensor(lengths)


def test_registered_word_encoder_that_outputs_the_joint_size():
    assert "uvs_gru" in list_text_encoders()
    encoder = _encoder(d=7)
    assert encoder.text_input == "words" and encoder.output_dim == 7 and encoder.penalty is None
    assert encoder(*_captions([3, 1], 4)).shape == (2, 7)


def test_parameter_count():
    """Embedding V x w and a PyTorch GRU: 3 gates x (w d + d d + two d-long biases)."""
    v, w, d = 11_360, 300, 1024
    encoder = create_text_encoder("uvs_gru", v, d=d, word_dim=w)
    assert encoder.num_parameters() == v * w + 3 * (w * d + d * d + 2 * d)


def test_output_is_the_state_after_the_last_real_word():
    torch.manual_seed(0)
    encoder = _encoder()
    tokens, lengths = _captions([4, 2, 6], 6)
    out = encoder(tokens, lengths)
    for row, n in enumerate(lengths.tolist()):
        _, last = encoder.gru(encoder.embedding(tokens[row:row + 1, :n]))
        torch.testing.assert_close(out[row], last[0, 0])


def test_padding_junk_and_batch_never_change_a_caption():
    torch.manual_seed(0)
    encoder = _encoder()
    tokens, lengths = _captions([5], 5)
    alone = encoder(tokens, lengths)
    junk = torch.cat([tokens, torch.randint(2, VOCAB, (1, 8))], dim=1)  # words after the length
    others, other_lengths = _captions([13, 1], 13, seed=1)
    batch = torch.cat([torch.cat([tokens, torch.zeros(1, 8, dtype=torch.long)], dim=1), others])
    torch.testing.assert_close(encoder(junk, lengths), alone)
    torch.testing.assert_close(encoder(batch, torch.cat([lengths, other_lengths]))[:1], alone)


def test_initialisation_follows_kiros():
    torch.manual_seed(0)
    encoder = _encoder(d=8, word_dim=5)
    weight = encoder.embedding.weight
    assert torch.all(weight[0] == 0) and weight.abs().max() <= 0.1
    assert encoder.gru.weight_ih_l0.abs().max() <= 0.1
    for gate in encoder.gru.weight_hh_l0.detach().split(8):
        torch.testing.assert_close(gate @ gate.T, torch.eye(8), rtol=0, atol=1e-5)
    assert torch.all(encoder.gru.bias_ih_l0 == 0) and torch.all(encoder.gru.bias_hh_l0 == 0)


def test_gradient_reaches_every_parameter_but_the_padding_word():
    torch.manual_seed(0)
    encoder = _encoder()
    tokens, lengths = _captions([3, 5], 5)
    encoder(tokens, lengths).pow(2).sum().backward()
    for name, p in encoder.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert torch.all(encoder.embedding.weight.grad[0] == 0)


def test_deterministic_given_a_seed_and_empty_caption_is_finite():
    tokens, lengths = _captions([0, 3], 4)
    outs = []
    for _ in range(2):
        torch.manual_seed(3)
        outs.append(_encoder()(tokens, lengths))
    assert torch.equal(outs[0], outs[1]) and torch.isfinite(outs[0]).all()


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="d and word_dim"):
        create_text_encoder("uvs_gru", VOCAB, d=0)
