"""PyTorch doing what bench_gpu times: W threads, each with its own CUDA
stream and copy of the MLP (ReLU between layers, softmax cross-entropy),
computing the gradient of a batch from pinned host samples to a host
gradient, over and over, for S seconds. Prints one line:
  "torch_gpu: LAYERS batch B workers W: STEPS steps/s SAMPLES samples/s"

usage: python3 bench/torch_gpu.py LAYERS BATCH WORKERS SECONDS
"""
import sys
import threading
import time

import torch


def worker(dims, batch, seconds, seed, barrier, out, idx):
    torch.manual_seed(seed)
    dev = torch.device("cuda:0")
    stream = torch.cuda.Stream(device=dev)
    with torch.cuda.stream(stream):
        layers = []
        for i in range(len(dims) - 1):
            layers.append(torch.nn.Linear(dims[i], dims[i + 1]))
            if i + 2 < len(dims):
                layers.append(torch.nn.ReLU())
        net = torch.nn.Sequential(*layers).to(dev)
        params = list(net.parameters())
        x = torch.rand(batch, dims[0]).pin_memory()
        y = torch.randint(0, dims[-1], (batch,)).pin_memory()
        flat = torch.empty(sum(p.numel() for p in params)).pin_memory()
        loss_fn = torch.nn.CrossEntropyLoss()

        def step():
            xd = x.to(dev, non_blocking=True)
            yd = y.to(dev, non_blocking=True)
            for p in params:
                p.grad = None
            loss = loss_fn(net(xd), yd)
            loss.backward()
            flat.copy_(torch.cat([p.grad.reshape(-1) for p in params]), non_blocking=True)
            stream.synchronize()
            return loss

        step()  # warm-up, not timed
        barrier.wait()
        steps, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            step()
            steps += 1
    out[idx] = steps


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    dims = [int(d) for d in sys.argv[1].split("-")]
    batch, workers, seconds = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32, as freshet computes
    torch.backends.cudnn.allow_tf32 = False
    barrier = threading.Barrier(workers)
    out = [0] * workers
    threads = [threading.Thread(target=worker, args=(dims, batch, seconds, 42 + i, barrier, out, i))
               for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    steps = sum(out)
    print("torch_gpu: %s batch %d workers %d: %.1f steps/s %.0f samples/s"
          % (sys.argv[1], batch, workers, steps / seconds, steps * batch / seconds))


if __name__ == "__main__":
    main()
