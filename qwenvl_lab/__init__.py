"""qwenvl-lab: how Qwen-VL injects image features through TensorRT-LLM's prompt table.

Public names load lazily (PEP 562), so `import qwenvl_lab` stays light and the TensorRT-LLM stage, whose
environment has an older transformers, can import `qwenvl_lab.trtllm` without pulling in the model.
"""

import importlib

_EXPORTS = {
    "tokenizing": ("Query", "QWenTokenizer", "decode_image_path", "load_tokenizer", "make_context", "vocab_file_path"),
    "grounding": ("Box", "box_answer", "draw_boxes", "iou", "parse_boxes", "to_list_format"),
    "img_pos": ("locate_img_pos",),
    "fake_ids": ("make_fake_prompt_ids", "replace_image_spans"),
    "prompt_table": (
        "ptuning_setup",
        "prompt_tuning_embedding",
        "single_table_batch",
        "per_request_tables",
        "runtime_prompt_table",
    ),
    "injection": ("overwrite_image_spans", "masked_scatter_images"),
    "vision": ("VisionTransformer", "load_image", "preprocess_images"),
    "modeling": ("QWenVLConfig", "QWenLMHeadModel"),
    "checkpoint": ("CheckpointError", "load_checkpoint", "make_tiny_checkpoint", "save_checkpoint"),
    "toy": ("load_course_model", "load_toy_model"),
    "engine": ("BuildConfig", "ModelRunner", "build_engine"),
    "infer": ("QWenInfer",),
    "chat": ("generate_for_qwenvl",),
    "trtllm.onnx_export": ("export_visual_onnx",),
    "trtllm.visual_plan": ("build_visual_plan",),
    "unified_checkpoint": ("convert_to_trtllm_checkpoint", "load_trtllm_checkpoint"),
    "trtllm.build_command": ("trtllm_build_command", "run_trtllm_build"),
    "trtllm.runner": ("TRTLLMRunner",),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name):
    """Import a public name from its step module on first use."""
    if name not in _WHERE:
        raise AttributeError(f"module 'qwenvl_lab' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)


def __dir__():
    return __all__
