"""transformers' CLIP, small and with random weights: the design article 1 compares the prompt table with (notebook 13).

Nothing is downloaded: the config is built here, and what CLIP does with a text and an image does not depend on
trained weights (two towers, a projection each, a scaled cosine between them).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import CLIPConfig, CLIPModel

TEXT = dict(vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4)
VISION = dict(
    image_size=32, patch_size=8, hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4
)
EOS_ID = 1  # the token CLIP's text tower pools at


@dataclass(frozen=True)
class SmallClip:
    """A random-weight CLIPModel and inputs for it: input_ids [texts, L] (each ending in EOS_ID), pixel_values
    [images, 3, 32, 32]."""

    model: CLIPModel
    input_ids: torch.Tensor
    pixel_values: torch.Tensor


def small_clip(seed: int = 0, texts: int = 3, images: int = 2, length: int = 7) -> SmallClip:
    """transformers' CLIPModel with a small config and random weights drawn from `seed`, and random inputs."""
    generator = torch.Generator().manual_seed(seed)
    config = CLIPConfig(
        text_config=dict(TEXT, max_position_embeddings=16, bos_token_id=0, eos_token_id=EOS_ID, pad_token_id=EOS_ID),
        vision_config=VISION,
        projection_dim=16,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = CLIPModel(config).eval()
    input_ids = torch.randint(2, TEXT["vocab_size"], (texts, length), generator=generator)
    input_ids[:, -1] = EOS_ID
    pixel_values = torch.randn(images, 3, VISION["image_size"], VISION["image_size"], generator=generator)
    return SmallClip(model, input_ids, pixel_values)


def projections(clip: SmallClip) -> tuple[torch.Tensor, torch.Tensor]:
    """The two towers' pooled, projected outputs, computed apart: (images [N, P], texts [T, P]), not normalised."""
    with torch.inference_mode():
        images = clip.model.get_image_features(pixel_values=clip.pixel_values).pooler_output  # [N, P]
        texts = clip.model.get_text_features(input_ids=clip.input_ids).pooler_output  # [T, P]
    return images, texts


def what_clip_does(seed: int = 0) -> dict:
    """What transformers' CLIPModel does with texts and images, measured: whether each tower's outputs change when
    the other input changes, whether the logits are the scaled cosine of the separate projections, and the shapes
    of the pooled image features beside the vision tower's per-patch states."""
    clip, other = small_clip(seed), small_clip(seed + 1)  # `other` supplies different texts and pictures
    model = clip.model
    with torch.inference_mode():
        out = model(input_ids=clip.input_ids, pixel_values=clip.pixel_values)
        new_picture = model(input_ids=clip.input_ids, pixel_values=other.pixel_values)
        new_text = model(input_ids=other.input_ids, pixel_values=clip.pixel_values)
        images, texts = projections(clip)
        cosine = F.normalize(images, dim=-1) @ F.normalize(texts, dim=-1).T  # [N, T]
        scale = float(model.logit_scale.exp())
    text_states, patch_states = out.text_model_output.last_hidden_state, out.vision_model_output.last_hidden_state
    return {
        "text ignores the picture": torch.equal(out.text_embeds, new_picture.text_embeds)
        and torch.equal(text_states, new_picture.text_model_output.last_hidden_state),
        "picture ignores the text": torch.equal(out.image_embeds, new_text.image_embeds)
        and torch.equal(patch_states, new_text.vision_model_output.last_hidden_state),
        "logits = scale × cosine": bool(torch.allclose(out.logits_per_image, scale * cosine, atol=1e-5)),
        "logit scale": scale,
        "text states": tuple(text_states.shape),  # [T, L, width]
        "patch states": tuple(patch_states.shape),  # [N, 1 + patches, width]
        "image features": tuple(out.image_embeds.shape),  # [N, P]
        "text features": tuple(out.text_embeds.shape),  # [T, P]
        "logits_per_image": tuple(out.logits_per_image.shape),  # [N, T]
    }
