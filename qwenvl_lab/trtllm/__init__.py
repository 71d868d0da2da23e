"""The TensorRT paths: vision tower → ONNX → TensorRT plan; language model → TensorRT-LLM checkpoint → engine → runner.

Import from the step modules (onnx_export, visual_plan, convert, build_command, runner, pipeline). This file imports
nothing on purpose: the GPU steps (visual_plan, build_command, runner) must load in a TensorRT-LLM environment, where
transformers is pinned to 4.57 and qwenvl_lab.modeling (transformers 5) cannot be imported.
"""
