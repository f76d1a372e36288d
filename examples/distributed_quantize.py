#!/usr/bin/env python3
"""Quantize a checkpoint with every GPU of a machine: one process per GPU
(torch.distributed, NCCL), each quantizing its share of the tensors on its own GPU and
writing its own shard; rank 0 writes an index of which shard holds which tensor.

    torchrun --nproc-per-node=2 examples/distributed_quantize.py IN.safetensors OUT_DIR --k 4
    python3 examples/distributed_quantize.py IN.safetensors OUT_DIR --k 4   (spawns one per GPU)

OUT_DIR gets model-00001-of-0000N.kbit.safetensors ... (kbit.load reads each) and
model.kbit.index.json ({"weight_map": {tensor name: shard file}}). Tensors are dealt out
largest first to the least loaded rank, so the shards hold about equal bytes.
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))


def plan(sizes: dict, world: int) -> dict:
    """{tensor name: rank}: the largest tensor next to the rank holding the fewest bytes."""
    load = [0] * world
    owner = {}
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        rank = min(range(world), key=lambda r: (load[r], r))
        owner[name] = rank
        load[rank] += sizes[name]
    return owner


def shard_name(rank: int, world: int) -> str:
    return f"model-{rank + 1:05d}-of-{world:05d}.kbit.safetensors"


def run(rank: int, world: int, args) -> None:
    import torch
    import torch.distributed as dist
    from safetensors import safe_open

    import kbit
    import kbit.torch as kt

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    try:
        with safe_open(args.input, framework="pt") as f:
            names = list(f.keys())
            sizes = {n: math.prod(f.get_slice(n).get_shape()) for n in names}
            owner = plan(sizes, world)
            out = {}
            for name in names:
                if owner[name] != rank:
                    continue
                t = f.get_tensor(name).to(f"cuda:{rank}")
                weight = t.is_floating_point() and t.dim() >= 2 and t.numel() >= args.min_elements
                out[name] = kt.quantize(t, k=args.k, codebook=args.codebook) if weight else t
        os.makedirs(args.output, exist_ok=True)
        kbit.save(out, os.path.join(args.output, shard_name(rank, world)),
                  metadata={"kbit.shard": f"{rank + 1}/{world}"})
        # every rank's tensor list reaches rank 0 over NCCL, which writes the index
        written = [None] * world
        dist.all_gather_object(written, sorted(out))
        if rank == 0:
            weight_map = {n: shard_name(r, world) for r, ns in enumerate(written) for n in ns}
            with open(os.path.join(args.output, "model.kbit.index.json"), "w") as fh:
                json.dump({"metadata": {"source": os.path.basename(args.input), "k": args.k},
                           "weight_map": weight_map}, fh, indent=1)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _spawned(rank: int, world: int, args, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    run(rank, world, args)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--codebook", default=None)
    ap.add_argument("--min-elements", type=int, default=256)
    ap.add_argument("--gpus", type=int, default=None, help="processes to spawn (default: all)")
    args = ap.parse_args(argv)
    if "RANK" in os.environ:  # started by torchrun
        run(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        return
    import socket

    import torch
    import torch.multiprocessing as mp
    world = args.gpus or torch.cuda.device_count()
    if world < 1:
        sys.exit("distributed_quantize: no CUDA device")
    with socket.socket() as s:  # a free port for the process group
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    mp.spawn(_spawned, args=(world, args, port), nprocs=world, join=True)


if __name__ == "__main__":
    main()
