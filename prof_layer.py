import torch, rnncc
from torch.nn.utils.rnn import pack_padded_sequence
from torch.profiler import profile, ProfilerActivity
H, B, T = 768, 16, 1024
cell = rnncc.load_builtin("lstm")
g = torch.Generator().manual_seed(0)
lens = torch.randint(256, T + 1, (B,), generator=g); lens[0] = T
m = rnncc.RNN(cell, H, H, 2, bidirectional=True, backend="fused", device="cuda", dtype=torch.bfloat16)
x = torch.randn(B, T, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
for packed in (False, True):
    def f():
        inp = pack_padded_sequence(x, lens, batch_first=True, enforce_sorted=False) if packed else x
        out = m(inp)[0]
        (out.data if packed else out).float().sum().backward()
    for _ in range(2): f()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as p:
        f(); torch.cuda.synchronize()
    print("packed" if packed else "full")
    print(p.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))
