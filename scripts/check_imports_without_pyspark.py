"""The modules a user of a trained tokenizer imports, and the pure core, import without pyspark
(as in a venv without it): pyspark is blocked here, then they are imported and a tokenizer
encodes and decodes. Run by CI and by tests/test_bpe_core.py. Exit 0 when all work."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PURE = ["pipeline.bpe", "pipeline.order", "pipeline.encoder", "pipeline.outputs",
        "pipeline.patterns", "pipeline.pretokenize", "pipeline.checkpoint", "pipeline.memory",
        "pipeline.engines.local", "pipeline.engines.planner", "pipeline.engines.partition",
        "pipeline.engines.deltas", "pipeline.engines.rounds", "pipeline.report",
        "pipeline.fsutil", "pipeline.run_dir"]


class NoPyspark:
    def find_spec(self, name, path=None, target=None):
        if name == "pyspark" or name.startswith(("pyspark.", "py4j")):
            raise ImportError(f"{name} is blocked: this check runs as without pyspark")
        return None


def main() -> int:
    sys.meta_path.insert(0, NoPyspark())
    import importlib

    for name in PURE:
        importlib.import_module(name)
    from pipeline.bpe import Merge, bytes_vocab
    from pipeline.encoder import Tokenizer
    from pipeline.pretokenize import PretokenizerSpec

    tok = Tokenizer(bytes_vocab(), [Merge(104, 105, 256, 2)], ["<|end|>"], PretokenizerSpec())
    ids = tok.encode("hi hi<|end|>", allowed_special="all")
    if ids != [256, 32, 256, 257] or tok.decode(ids) != "hi hi<|end|>":
        print(f"a tokenizer without pyspark encoded 'hi hi<|end|>' as {ids}", file=sys.stderr)
        return 1
    print(f"imported without pyspark: {', '.join(PURE)}; a tokenizer encodes and decodes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
