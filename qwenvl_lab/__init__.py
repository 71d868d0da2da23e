"""qwenvl-lab: how Qwen-VL injects image features through TensorRT-LLM's prompt table."""
from .tokenizing import Query, QWenTokenizer, decode_image_path, load_tokenizer, make_context, vocab_file_path
