"""The modules a user of a trained tokenizer imports, and the pure core, import without pyspark
(as in a venv without it): pyspark is blocked here, then they are imported. Run by CI and by
tests/test_bpe_core.py. Exit 0 when all import."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PURE = ["pipeline.bpe", "pipeline.order", "pipeline.encoder", "pipeline.outputs",
        "pipeline.pretokenize", "pipeline.checkpoint", "pipeline.memory",
        "pipeline.engines.local", "pipeline.engines.planner", "pipeline.engines.partition"]


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
    print(f"imported without pyspark: {', '.join(PURE)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
