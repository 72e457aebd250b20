"""Shared cases for the SmolLM2 speculative tests: chat questions and a SmolLM2-shaped drafter config."""

QUESTIONS = [
    "What is the capital of France?", "Write a Python function that reverses a string.",
    "Explain what a hash table is.", "List three primary colors.", "What does the `with` statement do in Python?",
    "Give me a haiku about autumn.", "How do I read a file line by line in Python?", "What is 17 times 23?",
    "Summarize the plot of Romeo and Juliet.", "What is a decorator?", "Name the planets of the solar system.",
    "Why is the sky blue?", "Write a SQL query that counts rows in a table.", "What is recursion?",
    "Translate 'good morning' into Spanish.", "What are Python list comprehensions?",
    "Describe the water cycle.", "What is the difference between a list and a tuple?",
    "Give three tips for writing clean code.", "What is an HTTP status code 404?",
]


def geometry_config(layout: str) -> dict:
    """A 1-layer random drafter shaped for SmolLM2 (hidden 576, 9/3 heads of 64, vocab 49152)."""
    base = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 1, "num_attention_heads": 9,
            "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152, "rms_norm_eps": 1e-5,
            "max_position_embeddings": 8192, "rope_theta": 100000.0, "model_type": "qwen3",
            "num_target_layers": 30}
    if layout == "dspark":
        return base | {"architectures": ["Qwen3DSparkModel"], "tie_word_embeddings": True, "block_size": 5,
                       "mask_token_id": 0, "target_layer_ids": [2, 14, 26], "markov_rank": 16,
                       "markov_head_type": "vanilla", "enable_confidence_head": True,
                       "confidence_head_with_markov": True}
    return base | {"architectures": ["DFlashDraftModel"], "tie_word_embeddings": True, "block_size": 5,
                   "dflash_config": {"mask_token_id": 0, "target_layer_ids": [2, 14, 26]}}
