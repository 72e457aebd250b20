import sys

sys.path.insert(0, "/work/main")
import mlx.core as mx
from engine.loading.default_model import obtain_gguf
from engine.loading.gguf_tokenizer import build_tokenizer

gguf = obtain_gguf(print)
_, meta = mx.load(str(gguf), return_metadata=True)
tok, specials = build_tokenizer(meta)
print("vocab", tok.get_vocab_size(), "specials", specials[:5], len(specials))
print("id2", tok.id_to_token(2), "id0", tok.id_to_token(0))
open("/tmp/gbench/tokenizer.json", "w").write(tok.to_str())
