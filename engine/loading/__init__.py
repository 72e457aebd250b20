"""Model loading: local mlx-lm directories, Hugging Face ids, the embedded default (GGUF
conversion) and drafter checkpoints."""
