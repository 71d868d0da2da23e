"""transformers' CLIP as notebook 13 measures it: the same random model from a seed, two towers that never see each
other's input, logits that are the scaled cosine of the separate projections."""

import torch

from qwenvl_lab.clip import projections, small_clip, what_clip_does


def test_the_same_seed_gives_the_same_model_and_inputs_and_leaves_the_global_generator_alone():
    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)
    a, b = small_clip(0), small_clip(0)
    assert torch.equal(torch.rand(1), expected)  # small_clip drew from its own generator
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.pixel_values, b.pixel_values)
    assert torch.equal(a.model.text_projection.weight, b.model.text_projection.weight)
    assert not torch.equal(small_clip(1).model.text_projection.weight, a.model.text_projection.weight)
    assert a.input_ids.shape == (3, 7) and bool((a.input_ids[:, -1] == 1).all()) and a.pixel_values.shape[0] == 2


def test_what_clip_does_separate_towers_and_a_scaled_cosine():
    seen = what_clip_does(0)
    assert seen["text ignores the picture"] and seen["picture ignores the text"] and seen["logits = scale × cosine"]
    assert seen["image features"] == (2, 16) and seen["text features"] == (3, 16)
    assert seen["patch states"] == (2, 17, 32) and seen["logits_per_image"] == (2, 3)


def test_projections_are_the_unnormalised_pooled_outputs():
    clip = small_clip(2)
    images, texts = projections(clip)
    with torch.inference_mode():
        out = clip.model(input_ids=clip.input_ids, pixel_values=clip.pixel_values)
    assert torch.allclose(torch.nn.functional.normalize(images, dim=-1), out.image_embeds, atol=1e-6)
    assert not torch.allclose(images.norm(dim=-1), torch.ones(2))  # not normalised yet
