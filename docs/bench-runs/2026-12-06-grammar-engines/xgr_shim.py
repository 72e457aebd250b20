"""Import xgrammar on a machine WITHOUT torch/transformers (unsupported hack, for measurement only).

xgrammar 0.2.9's Python layer imports torch at module level (testing.py, matcher.py: only for
torch.int32 / torch.full in allocate_token_bitmask) and transformers in tokenizer_info.py (type
imports). The C++ core takes any DLPack int32 array. We import tvm_ffi first (so it does not
detect a torch), then register stub modules so `import xgrammar` succeeds; bitmasks are numpy.
"""

import sys
import types
import numpy as np
import tvm_ffi  # noqa: F401  (must be imported before the stubs)


def _install():
    if "torch" in sys.modules:
        return
    t = types.ModuleType("torch")
    t.__stub__ = True
    t.int32 = np.int32

    class Tensor:
        pass

    t.Tensor = t.LongTensor = t.FloatTensor = Tensor
    t.tensor = lambda v, dtype=None: np.array(v, dtype=dtype)
    t.full = lambda shape, v, dtype=None: np.full(shape, v, dtype=dtype)
    tr = types.ModuleType("transformers")
    tr.__stub__ = True

    class PreTrainedTokenizerBase:
        pass

    class PreTrainedTokenizerFast(PreTrainedTokenizerBase):
        pass

    class LogitsProcessor:
        pass

    tr.PreTrainedTokenizerBase = PreTrainedTokenizerBase
    tr.PreTrainedTokenizerFast = PreTrainedTokenizerFast
    tr.LogitsProcessor = LogitsProcessor
    sys.modules["torch"] = t
    sys.modules["transformers"] = tr


_install()
