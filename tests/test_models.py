"""Text encoders, the registry, the joint embedding model and the papers' parameter counts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from train.models import (
    ModelSpec,
    VisualSemanticEmbedding,
    build_model,
    create_image_encoder,
    create_text_encoder,
    list_text_encoders,
    register_text_encoder,
)
from train.models.family import train_settings
from train.models.maxout import CharMaxoutConv, MaxoutConv1d, length_mask, maxout

OECC_TABLE_1 = {"oecc_a": 517_120, "oecc_b": 258_560 + 1_311_744, "oecc_c": 1_244_928, "oecc_d": 4_713_472}
WIDTHS = (0.5, 0.75, 1.0, 1.25, 1.5)
CHAIN_TABLE_1 = {
    "chain_v1": (1.47e6, 2.52e6, 3.79e6, 5.27e6, 6.96e6),
    "chain_v2": (1.16e6, 1.80e6, 2.50e6, 3.26e6, 4.06e6),
}
#: the exact counts the README's parameter table prints (text encoder + W_t, d = 1024, alphabet 72)
CHAIN_README = {
    "chain_v1": (1_488_320, 2_517_312, 3_759_296, 5_214_272, 6_882_240),
    "chain_v2": (1_164_736, 1_786_176, 2_456_768, 3_176_512, 3_945_408),
}


def _batch(alphabet: int, lengths: list[int], steps: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random characters (2 .. alphabet-1) padded with 0 up to ``steps``."""
    gen = torch.Generator().manual_seed(seed)
    chars = torch.zeros(len(lengths), steps, dtype=torch.long)
    for row, n in enumerate(lengths):
        chars[row, :n] = torch.randint(2, alphabet, (n,), generator=gen)
    return chars, torch.tensor(lengths)


def test_registry_lists_the_papers_encoders():
    assert {"chain_v1", "chain_v2", "oecc_a", "oecc_b", "oecc_c", "oecc_d"} <= set(list_text_encoders())
    with pytest.raises(KeyError, match="unknown text encoder"):
        create_text_encoder("no_such_encoder", 10)
    with pytest.raises(ValueError, match="already registered"):
        register_text_encoder("oecc_a")(lambda alphabet_size: None)


@pytest.mark.parametrize("name", sorted(OECC_TABLE_1))
def test_oecc_counts_match_table_1_exactly(name):
    encoder = create_text_encoder(name, 72)
    assert encoder.num_parameters() == OECC_TABLE_1[name]
    assert encoder.output_dim == 512


def test_chain_vse_counts_are_the_readmes_and_near_table_1():
    """Text encoder + W_t (d = 1024), alphabet of 72, against CHAIN-VSE table 1."""
    lines = [f"{'model':<9} {'p':>5} {'ours':>10} {'table 1':>10} {'error':>7}"]
    worst = 0.0
    for name, table in CHAIN_TABLE_1.items():
        for p, expected in zip(WIDTHS, table, strict=True):
            model = VisualSemanticEmbedding(create_text_encoder(name, 72, p=p),
                                            create_image_encoder("linear", (8,), 1024), d=1024)
            report = model.parameter_report()
            ours = report["text_encoder"] + report["text_projection"]
            error = ours / expected - 1
            worst = max(worst, abs(error))
            lines.append(f"{name:<9} {p:>5} {ours:>10,} {int(expected):>10,} {error:>+7.1%}")
            # exactly what the README prints: a kernel or width change of even one weight shows here
            assert ours == CHAIN_README[name][WIDTHS.index(p)], (name, p, ours)
    print("\n" + "\n".join(lines))
    assert worst < 0.05  # the paper's table 1 rounds to 0.01M; ours are within 2%


def test_chain_vse_output_size_is_4_times_256p():
    assert create_text_encoder("chain_v1", 72, p=1.0).output_dim == 1024
    assert create_text_encoder("chain_v2", 72, p=0.5).output_dim == 512


def test_maxout_convolution_has_two_weight_tensors_and_biases():
    conv = MaxoutConv1d(72, 512, 7)
    assert sum(p.numel() for p in conv.parameters()) == 72 * 7 * 512 * 2 + 512 * 2
    char = CharMaxoutConv(72, 512, 7)
    assert sum(p.numel() for p in char.parameters()) == 517_120


def test_maxout_is_the_max_of_the_two_convolutions_and_its_gradient_is_exact():
    pre = torch.randn(2, 6, 5, dtype=torch.double, requires_grad=True)
    torch.testing.assert_close(maxout(pre), torch.maximum(pre[:, :3], pre[:, 3:]))
    assert torch.autograd.gradcheck(maxout, (pre,))


@pytest.mark.parametrize("kernel", [7, 2])
def test_char_convolution_equals_a_convolution_on_one_hot(kernel):
    torch.manual_seed(0)
    alphabet, filters = 11, 4
    char = CharMaxoutConv(alphabet, filters, kernel)
    chars, lengths = _batch(alphabet, [6, 3], steps=8)
    mask = length_mask(lengths, 8)
    ours = char(chars, mask)
    # reference: a dense conv over the one-hot input, zero beyond each length
    one_hot = F.one_hot(chars, alphabet).float().transpose(1, 2) * mask
    weight = char.weight.permute(2, 0, 1)  # (2 * filters, alphabet, kernel)
    left = (kernel - 1) // 2
    pre = F.conv1d(F.pad(one_hot, (left, kernel - 1 - left)), weight, char.bias)
    reference = torch.maximum(pre[:, :filters], pre[:, filters:]) * mask
    torch.testing.assert_close(ours, reference)


ENCODERS = [("oecc_a", {}), ("oecc_c", {}), ("chain_v1", {"p": 0.125}), ("chain_v2", {"p": 0.125})]


@pytest.mark.parametrize("name,kwargs", ENCODERS)
def test_output_does_not_depend_on_batch_padding(name, kwargs):
    torch.manual_seed(0)
    encoder = create_text_encoder(name, 20, **kwargs).eval()
    lengths = [13, 1, 7, 4]
    short_chars, lens = _batch(20, lengths, steps=13)
    long_chars = F.pad(short_chars, (0, 19))  # the same captions padded to 32
    garbage = long_chars.clone()
    garbage[:, 13:] = torch.randint(2, 20, (4, 19))  # whatever lies beyond a length must not matter
    garbage[1, 1:] = 5
    with torch.no_grad():
        short = encoder(short_chars, lens)
        padded = encoder(long_chars, lens)
        noisy = encoder(garbage, lens)
        alone = torch.cat([encoder(short_chars[i:i + 1, :n], lens[i:i + 1]) for i, n in enumerate(lengths)])
    assert short.shape == (4, encoder.output_dim)
    torch.testing.assert_close(padded, short)
    torch.testing.assert_close(noisy, short)
    torch.testing.assert_close(alone, short)


@pytest.mark.parametrize("name,kwargs", ENCODERS)
def test_encoders_are_deterministic_given_a_seed_and_train(name, kwargs):
    chars, lengths = _batch(20, [9, 5], steps=9)
    outputs = []
    for _ in range(2):
        torch.manual_seed(3)
        encoder = create_text_encoder(name, 20, **kwargs)
        outputs.append(encoder(chars, lengths))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)
    outputs[1].sum().backward()  # the second encoder's graph: every parameter takes part
    grads = [p.grad for p in encoder.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_visual_semantic_embedding_lives_on_the_positive_unit_sphere():
    torch.manual_seed(0)
    model = VisualSemanticEmbedding(create_text_encoder("oecc_a", 20),
                                    create_image_encoder("linear", (16,), 8), d=8)
    chars, lengths = _batch(20, [5, 3, 6], steps=6)
    images, captions = model(torch.randn(3, 16), chars, lengths)
    for z in (images, captions):
        assert z.shape == (3, 8)
        assert (z >= 0).all()
        torch.testing.assert_close(z.norm(dim=1), torch.ones(3))
    report = model.parameter_report()
    assert report["text_projection"] == 8 * 512 and report["image_encoder"] == 8 * 16
    assert report["total"] == report["text_encoder"] + report["text_projection"] + report["image_encoder"]


def test_build_model_follows_the_train_settings():
    chain = build_model(train_settings(family="chain", out="r", version="v2", p=0.5, d=64), 30, 12)
    assert chain.text_encoder.output_dim == 512
    assert any(type(m).__name__ == "SeparableMaxoutConv1d" for m in chain.modules())
    assert chain.parameter_report()["text_projection"] == 64 * 512
    assert chain.parameter_report()["image_encoder"] == 64 * 12
    oecc = build_model(train_settings(family="oecc", out="r", arch="B", d=32), 72, 12)
    assert oecc.parameter_report()["text_encoder"] == OECC_TABLE_1["oecc_b"]
    # region families read (k, D) rows: one vector per image is refused
    with pytest.raises(ValueError, match="region features"):
        build_model(train_settings(family="liwe", out="r"), 30, 12)


def test_checkpoints_that_named_w_i_image_projection_still_load():
    model = build_model(train_settings(family="oecc", out="r", arch="A", d=8), 20, 12)
    state = model.state_dict()
    state["image_projection.weight"] = state.pop("image_encoder.projection.weight")
    fresh = build_model(train_settings(family="oecc", out="r", arch="A", d=8, seed=1), 20, 12)
    fresh.load_state_dict(state)
    assert torch.equal(fresh.image_encoder.projection.weight, state["image_projection.weight"])


def test_image_encoder_registry_and_model_spec_options():
    with pytest.raises(KeyError, match="unknown image encoder"):
        create_image_encoder("no_such_encoder", (4,), 2)
    with pytest.raises(ValueError, match="region"):
        create_image_encoder("linear", (36, 2048), 8)
    with pytest.raises(ValueError, match="text input"):
        ModelSpec("oecc_a", text_input="bytes")
    # no W_t: the encoder must already output d; with a bias: W_t has d more parameters
    encoder = create_text_encoder("oecc_a", 20)
    with pytest.raises(ValueError, match="needs a text projection"):
        VisualSemanticEmbedding(encoder, create_image_encoder("linear", (4,), 8), d=8, text_projection=False)
    same = VisualSemanticEmbedding(encoder, create_image_encoder("linear", (4,), 512), d=512,
                                   text_projection=False, absolute=False)
    assert same.parameter_report()["text_projection"] == 0
    biased = VisualSemanticEmbedding(create_text_encoder("oecc_a", 20),
                                     create_image_encoder("linear", (4,), 8), d=8, text_projection_bias=True)
    assert biased.parameter_report()["text_projection"] == 8 * 512 + 8
    chars, lengths = _batch(20, [4, 2], steps=4)
    assert (same.encode_captions(chars, lengths) < 0).any()  # no |.|: cosine models keep signs
